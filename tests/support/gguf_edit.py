"""Edit a GGUF with gguf-py: the tests' way to make files upstream would reject."""

import gguf
import numpy as np


def rewrite(src, dst, drop_keys=(), set_keys=None, drop_tensors=(), reshape=None):
    """Copy a GGUF, editing keys and tensors, with gguf-py."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "dflash")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys:
            continue
        vtype = gguf.GGUFValueType(int(f.types[0]))
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType(int(f.types[1]))
            vals = [bytes(f.parts[i]).decode() if sub == gguf.GGUFValueType.STRING else f.parts[i][0].item()
                    for i in f.data]
            w.add_key_value(name, vals, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode(), vtype)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), vtype)
    for name, (vtype, value) in (set_keys or {}).items():
        # arrays of ints are int32, as the loader's integer array keys are; bools stay bools
        sub = None
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType.BOOL if all(isinstance(v, bool) for v in value) else gguf.GGUFValueType.INT32
        w.add_key_value(name, list(value) if sub else value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = np.zeros(reshape[t.name], dtype=data.dtype)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_tensors(path, tensors: dict, arch: str = "llama"):
    """A GGUF of `tensors` ({name: (array, ggml quantization type or None for as it is)}) and no
    keys but the architecture."""
    w = gguf.GGUFWriter(str(path), arch)
    for name, (arr, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
