.PHONY: test fuzz fuzz-reference

test:
	python3 -m pytest -q -x

# >= 10,000 fuzz cases (2,500 per input family) with a fresh seed; failures are saved under tests/fuzz/crashes/
fuzz:
	python3 tests/fuzz/fuzz_main.py --n $${N:-2500} $${SEED:+--seed $$SEED}

# the long mode against llama.cpp b11739: >= 10,000 GGUFs and 10,000 batches compared (SEED=...)
fuzz-reference:
	python3 tests/fuzz/fuzz_long.py --ggufs 13000 --batches 13000 $${SEED:+--seed $$SEED}
