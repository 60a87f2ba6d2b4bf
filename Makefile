.PHONY: test fuzz

test:
	python3 -m pytest -q -x

# >= 10,000 fuzz cases (2,500 per input family) with a fresh seed; failures are saved under tests/fuzz/crashes/
fuzz:
	python3 tests/fuzz/fuzz_main.py --n $${N:-2500} $${SEED:+--seed $$SEED}
