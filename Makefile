.PHONY: test fuzz fuzz-reference sessions

test:
	python3 -m pytest -q -x -n 2 --dist worksteal

# >= 10,000 fuzz cases (2,500 per input family) with a fresh seed; failures are saved under tests/fuzz/crashes/
fuzz:
	python3 tests/fuzz/fuzz_main.py --n $${N:-2500} $${SEED:+--seed $$SEED}

# the long mode against llama.cpp b11739: >= 10,000 GGUFs and 10,000 batches compared (SEED=...)
fuzz-reference:
	python3 tests/fuzz/fuzz_long.py --ggufs 13000 --batches 13000 $${SEED:+--seed $$SEED}

# whole sessions against llama.cpp b11739: 100 random sessions per variant, 500 in all (N=..., FIRST=...)
sessions:
	python3 tests/support/sessions.py --per-variant $${N:-100} --first-seed $${FIRST:-0}
