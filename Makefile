# Thin wrapper over CMake/ctest. `make help` lists the targets.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTUNER = $(BUILD)/ctuner

.PHONY: record-config record-losses test-sabotage
.PHONY: all build deps cuda-deps gpu-pack gpu-check test demo demo-lora demo-vae bench bench-gemm bench-dist bench-offload bench-data bench-s3 fuzz fuzz-long soak asan format format-check clean help golden interop

all: build

help:
	@echo "make            build (Release) into $(BUILD)/"
	@echo "make test       install missing packages (and the CUDA 13.0 wheels: the CUDA backend is always compiled),"
	@echo "                check formatting, build with -Werror, run every test (ctest),"
	@echo "                a 10 s fuzz run per parser, then every test again under ASan+UBSan"
	@echo "make demo       install, build, train the small preset on synthetic shapes, sample and judge (demo-output/)"
	@echo "make demo-lora  teach the demo's base a new colour word with a LoRA; judged before/after (demo-lora-output/)"
	@echo "make demo-vae   train a small VAE, then the demo's MMDiT on its latents; judge both (examples/vae_latent)"
	@echo "make bench      ctuner bench step --preset bench and the PyTorch peers (Debian torch 1.13; diffusers Flux on PyPI torch 2: eager, bf16, compile) interleaved in one run"
	@echo "make bench-gemm ct_sgemm per path against OpenBLAS and AVX2 against AVX-512 at the model's shapes, 1 thread (CPU time)"
	@echo "make bench-dist 2 ranks x 1 thread vs 1 rank x 2 threads (data parallel, ZeRO 0-3)"
	@echo "make bench-offload  step time with the optimizer state offloaded to a file vs in memory (small preset)"
	@echo "make bench-data discovery (headers) vs full decode on 10,000 images; latent cache size raw/gzip/zstd"
	@echo "make bench-s3   fetch 2,000 small objects from a local S3 server (s3rver) with a pool of 32 vs 1; train from it vs local disk"
	@echo "make fuzz       60 s libFuzzer run per target (safetensors, images, parquet, config, BPE, S3 XML) under ASan (clang)"
	@echo "make fuzz-long  the same, 10 minutes per target, one target at a time (results: build-fuzz/results.txt)"
	@echo "make soak       fault campaigns on the Release build: 50 kill -9 + resume (bit-identical), ENOSPC in a checkpoint,"
	@echo "                corrupt/truncated cache and checkpoint files, a rank killed/stopped under ZeRO-3, S3 failing"
	@echo "                mid-upload (docs/reliability.md; results: build/soak/results.md)"
	@echo "make asan       build with ASan+UBSan into build-asan/ and run the tests (CT_TEST_REDUCED=1: docs/testing.md)"
	@echo "make golden     regenerate tests/data golden files from the PyTorch peer"
	@echo "make gpu-pack   build ctuner with CUDA here and pack it with its libraries for the GPU machine (.gpu-pack/)"
	@echo "make gpu-check  on the GPU machine: ops vs references and CPU, training parity, bench vs PyTorch (docs/cuda.md)"
	@echo "make record-config  rewrite tests/data/realcfg/expected/ from ctuner config check (review the diff)"
	@echo "make record-losses  record tests/cli_losses.sh's golden for this build and CPU (BUILD=build-asan: the ASan one)"
	@echo "make test-sabotage  apply known-bad patches (tests/sabotage/) to a copy of the tree; each must fail its test"
	@echo "make interop    live checks against PyPI libraries (scripts/py_deps.sh, a venv in ~/.cache/ctuner):"
	@echo "                TensorBoard's reader and tensorboard --logdir on event files; T5 tokenizer and encoder"
	@echo "                vs transformers/tokenizers/sentencepiece (committed goldens and a fresh set); the same for"
	@echo "                FLUX's CLIP text encoder and CLIPTokenizer (scripts/clip_golden.py); a FluxPipeline's"
	@echo "                tokenizers as transformers 5 saves them (scripts/tokenizer_tf5_golden.py)"
	@echo "                FlowMatchEulerDiscreteScheduler as FluxPipeline drives it vs diffusers (fm_sched_golden.py)"
	@echo "                config.toml fixtures against Python's tomllib"
	@echo "                the Hugging Face cache: huggingface_hub/diffusers read ctuner's, ctuner reads theirs (hub_interop.sh)"
	@echo "                Flux transformer vs diffusers' FluxTransformer2DModel (torch 2 + diffusers in their own"
	@echo "                venv, ~5.5 GB): goldens, fresh ones, ctuner-saved diffusers/BFL files read back"
	@echo "                LoRA vs peft and LyCORIS (lycoris-lora) adapters: goldens, fresh ones, ctuner-saved"
	@echo "                adapter files read back (load_lora_adapter, create_lycoris_from_weights); kohya,"
	@echo "                ComfyUI, BFL-named and LyCORIS-on-BFL files vs diffusers' converter (lora_files_golden.py)"
	@echo "                int8 weights vs optimum-quanto and torchao (scripts/quant_golden.py)"
	@echo "                SDXL's U-net vs diffusers' UNet2DConditionModel: goldens and a fresh set (unet_golden.py);"
	@echo "                its LoRA vs peft, ctuner's file through load_lora_weights (unet_lora_golden.py)"
	@echo "                an SDXL training step vs UNet2DConditionModel + DDPMScheduler, and its output_dir/pipeline"
	@echo "                loaded by StableDiffusionXLPipeline (scripts/sdxl_trained_interop.sh)"
	@echo "make lora-quant-long  200 LoRA steps on int8-quanto/int8-torchao bases vs a bf16 base (~2 min)"
	@echo "                LoRA tools: a ctuner-trained adapter, its lora merge and its kohya export through diffusers'"
	@echo "                load_lora_weights / fuse_lora (scripts/lora_tools_interop.sh)"
	@echo "make format     clang-format the sources"
	@echo "make format-check  fail if a source differs from clang-format's output (first step of make test)"

deps:
	@scripts/deps.sh

# The CUDA toolchain (NVIDIA's PyPI wheels pinned to CUDA 13.0) so that every test run compiles the
# CUDA backend; a GPU is needed only to run it (docs/cuda.md).
cuda-deps:
	@scripts/cuda_deps.sh >/dev/null

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: $(BUILD)/Makefile
	@cmake --build $(BUILD) -j $(JOBS)

test: deps cuda-deps
	$(MAKE) format-check
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCT_WERROR=ON -DCT_CUDA=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && CT_IN_MAKE_TEST=1 ctest --output-on-failure --no-tests=error --timeout 1200
	scripts/fuzz.sh 10
	$(MAKE) asan

demo: deps build
	scripts/demo.sh $(CTUNER)

demo-lora: deps build
	scripts/demo_lora.sh $(CTUNER)

demo-vae: deps build
	scripts/demo_vae.sh $(CTUNER)

bench: build
	scripts/bench.sh $(CTUNER)

bench-gemm: build
	OMP_NUM_THREADS=1 $(BUILD)/bench_gemm 9 blas
	if grep -qw avx2 /proc/cpuinfo; then OMP_NUM_THREADS=1 CT_GEMM=avx2 $(BUILD)/bench_gemm 9 blas; fi
	if grep -qw avx512f /proc/cpuinfo; then OMP_NUM_THREADS=1 CT_GEMM=avx2 $(BUILD)/bench_gemm 9 avx512; fi
	if grep -qw avx512_bf16 /proc/cpuinfo; then OMP_NUM_THREADS=1 $(BUILD)/bench_gemm 9 avx512 bf16; fi

bench-dist: deps build
	scripts/bench_dist.sh $(CTUNER)

bench-offload: build
	scripts/bench_offload.sh $(CTUNER)

bench-data: deps build
	scripts/bench_data.sh $(CTUNER)

bench-s3: build
	scripts/bench_s3.sh $(CTUNER)
	scripts/bench_s3_train.sh $(CTUNER)

fuzz: deps
	scripts/fuzz.sh 60

fuzz-long: deps
	scripts/fuzz.sh 600

soak: build
	scripts/soak.sh $(CTUNER)

asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSANITIZE=address -DCT_WERROR=ON -DCT_CUDA=OFF >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && CT_IN_MAKE_TEST=1 CT_TEST_REDUCED=1 ctest --output-on-failure --no-tests=error --timeout 3000

golden:
	scripts/golden.sh

# On the GPU machine (docs/cuda.md): every CUDA check in one run (~7 minutes on an H100). Prepare the
# binaries on a CPU machine first with `make gpu-pack` and carry .gpu-pack to the GPU machine.
gpu-pack: cuda-deps
	scripts/gpu_pack.sh

gpu-check:
	scripts/gpu_check.sh
ifneq ($(filter test asan,$(MAKECMDGOALS)),)
ifneq ($(filter record-% test-sabotage,$(MAKECMDGOALS)),)
$(error record-* and test-sabotage do not run together with make test or make asan)
endif
endif
# Expectations written by the code under test: only on purpose, never by a test
# run (the scripts refuse --record under ctest, and these targets under make test).
record-config:
	@[ -z "$${CT_IN_MAKE_TEST:-}$${CT_UNDER_CTEST:-}" ] || { echo "record-config: refused under make test"; exit 1; }
	@[ -x $(CTUNER) ] || { echo "record-config: no $(CTUNER): make build first"; exit 1; }
	bash tests/cli_config.sh $(CTUNER) --record
	git status --short tests/data/realcfg/expected

# Known-bad patches (tests/sabotage/*.patch) applied to a copy of the tree in
# build-sabotage/: each must make its checks fail (scripts/sabotage.sh).
test-sabotage:
	scripts/sabotage.sh

record-losses:
	@[ -z "$${CT_IN_MAKE_TEST:-}$${CT_UNDER_CTEST:-}" ] || { echo "record-losses: refused under make test"; exit 1; }
	@[ -x $(CTUNER) ] || { echo "record-losses: no $(CTUNER): make build (or make asan) first"; exit 1; }
	bash tests/cli_losses.sh $(CTUNER) --record
	git status --short tests/data/losses

# Live re-checks against the PyPI libraries and the peers' own readers (network on first use; a venv in
# ~/.cache/ctuner, scripts/py_deps.sh). T5: the committed goldens must
# reproduce, and ctuner must match a fresh tokenizer, caption set and encoder (seed 1).
interop: build
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/flux_tiny_pipeline.py --check tests/data/flux_pipe
	py=$$(scripts/py_deps.sh diffusers) && rm -rf $(BUILD)/flux-pipe-fresh && \
	  $$py scripts/flux_tiny_pipeline.py --seed 1 --out $(BUILD)/flux-pipe-fresh && \
	  CT_FLUX_PIPE_DATA=$(abspath $(BUILD))/flux-pipe-fresh $(BUILD)/ct_tests flux_pipe
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/flux_kontext_golden.py --check tests/data/flux_kontext && \
	  rm -rf $(BUILD)/kontext-fresh && \
	  $$py scripts/flux_kontext_golden.py --seed 1 --pipe $(BUILD)/flux-pipe-fresh/dev --out $(BUILD)/kontext-fresh && \
	  CT_FLUX_PIPE_DATA=$(abspath $(BUILD))/flux-pipe-fresh CT_FLUX_KONTEXT_DATA=$(abspath $(BUILD))/kontext-fresh \
	  $(BUILD)/ct_tests flux_pipe
	bash scripts/flux_trained_interop.sh $(CTUNER) $(BUILD)/flux-pipe-interop
	bash tests/cli_tensorboard.sh $(CTUNER) --live "$$(scripts/py_deps.sh tensorboard)"
	py=$$(scripts/py_deps.sh t5) && $$py scripts/t5_golden.py --check tests/data/t5 && \
	  rm -rf $(BUILD)/t5-interop && mkdir -p $(BUILD)/t5-interop && \
	  $$py scripts/t5_golden.py --seed 1 --out $(BUILD)/t5-interop
	CT_T5_DATA=$(abspath $(BUILD))/t5-interop $(BUILD)/ct_tests t5
	py=$$(scripts/py_deps.sh t5) && $$py scripts/clip_golden.py --check tests/data/clip && \
	  rm -rf $(BUILD)/clip-interop && $$py scripts/clip_golden.py --seed 1 --out $(BUILD)/clip-interop
	CT_CLIP_DATA=$(abspath $(BUILD))/clip-interop $(BUILD)/ct_tests clip
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/tokenizer_tf5_golden.py --check tests/data/flux_pipe_tf5
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/fm_sched_golden.py --check tests/data/fm_sched_golden.json && \
	  $$py scripts/fm_sched_golden.py --seed 1 --out $(BUILD)/fm_sched_interop.json
	CT_FM_SCHED_GOLDEN=$(abspath $(BUILD))/fm_sched_interop.json $(BUILD)/ct_tests fm_sched
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/sdxl_sched_golden.py --seed 1 --out $(BUILD)/sdxl_sched_interop.json
	py=$$(scripts/py_deps.sh diffusers) && rm -rf $(BUILD)/sdxl-pipe-fresh && \
	  $$py scripts/sdxl_tiny_pipeline.py --seed 1 --out $(BUILD)/sdxl-pipe-fresh && \
	  CT_SDXL_PIPE_DATA=$(abspath $(BUILD))/sdxl-pipe-fresh $(BUILD)/ct_tests sdxl_pipe && \
	  $$py scripts/sdxl_sample_golden.py --seed 1 --pipe $(BUILD)/sdxl-pipe-fresh && \
	  CT_SDXL_PIPE_DATA=$(abspath $(BUILD))/sdxl-pipe-fresh $(BUILD)/ct_tests sdxl_sample
	CT_SDXL_SCHED_GOLDEN=$(abspath $(BUILD))/sdxl_sched_interop.json $(BUILD)/ct_tests diffusion
	bash scripts/sdxl_trained_interop.sh $(CTUNER) $(BUILD)/sdxl-train-interop
	/usr/bin/python3 scripts/toml_expect.py --check
	bash scripts/hub_interop.sh $(CTUNER)
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/lora_golden.py --check tests/data/lora && \
	  rm -rf $(BUILD)/lora-interop && $$py scripts/lora_golden.py --seed 1 --out $(BUILD)/lora-interop && \
	  CT_LORA_DATA=$(abspath $(BUILD))/lora-interop CT_LORA_SAVED=$(abspath $(BUILD))/lora-saved.safetensors \
	    CT_LORA_DORA_SAVED=$(abspath $(BUILD))/lora-dora-saved.safetensors $(BUILD)/ct_tests lora && \
	  $$py scripts/lora_golden.py --load $(BUILD)/lora-saved.safetensors --ref $(BUILD)/lora-interop/ai-toolkit && \
	  $$py scripts/lora_golden.py --load $(BUILD)/lora-dora-saved.safetensors --ref $(BUILD)/lora-interop/dora
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/lycoris_golden.py --check tests/data/lycoris && \
	  rm -rf $(BUILD)/lycoris-interop $(BUILD)/lycoris-saved && mkdir -p $(BUILD)/lycoris-saved && \
	  $$py scripts/lycoris_golden.py --seed 1 --out $(BUILD)/lycoris-interop && \
	  CT_LYCORIS_DATA=$(abspath $(BUILD))/lycoris-interop CT_LYCORIS_SAVED=$(abspath $(BUILD))/lycoris-saved \
	    $(BUILD)/ct_tests lycoris && \
	  for n in locon loha lokr lokr_full lokr_both; do \
	    $$py scripts/lycoris_golden.py --load $(BUILD)/lycoris-saved/$$n.safetensors \
	      --ref $(BUILD)/lycoris-interop/$$n || exit 1; done
	bash scripts/lora_tools_interop.sh $(CTUNER) $(BUILD)/lora-tools-interop
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/lora_files_golden.py --check tests/data/lora_files && \
	  rm -rf $(BUILD)/lora-files-interop && \
	  $$py scripts/lora_files_golden.py --seed 1 --out $(BUILD)/lora-files-interop && \
	  CT_LORA_FILES_DATA=$(abspath $(BUILD))/lora-files-interop $(BUILD)/ct_tests lora_files
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/unet_golden.py --check tests/data/unet && \
	  $$py scripts/unet_golden.py --check tests/data/unet/sd && \
	  rm -rf $(BUILD)/unet-interop && $$py scripts/unet_golden.py --seed 1 --out $(BUILD)/unet-interop && \
	  $$py scripts/unet_golden.py --seed 1 --variant sd --out $(BUILD)/unet-interop/sd && \
	  CT_UNET_DATA=$(abspath $(BUILD))/unet-interop $(BUILD)/ct_tests unet && \
	  $$py scripts/unet_lora_golden.py --base tests/data/unet --check tests/data/unet/lora && \
	  $$py scripts/unet_lora_golden.py --seed 1 --base $(BUILD)/unet-interop --out $(BUILD)/unet-interop/lora && \
	  CT_UNET_DATA=$(abspath $(BUILD))/unet-interop CT_UNET_LORA_SAVED=$(abspath $(BUILD))/unet-interop/lora-saved \
	    $(BUILD)/ct_tests unet_lora && \
	  $$py scripts/unet_lora_golden.py --base $(BUILD)/unet-interop --check $(BUILD)/unet-interop/lora \
	    --file $(BUILD)/unet-interop/lora-saved/pytorch_lora_weights.safetensors
	py=$$(scripts/py_deps.sh diffusers) && $$py scripts/flux_golden.py --check tests/data/flux && \
	  rm -rf $(BUILD)/flux-interop && mkdir -p $(BUILD)/flux-interop && \
	  $$py scripts/flux_golden.py --seed 1 --out $(BUILD)/flux-interop/gold && \
	  CT_FLUX_DATA=$(abspath $(BUILD))/flux-interop/gold $(BUILD)/ct_tests flux && \
	  $(CTUNER) model convert --from tests/data/flux/dev/transformer --layout bfl \
	    --to $(BUILD)/flux-interop/dev.safetensors && \
	  $(CTUNER) model convert --from $(BUILD)/flux-interop/dev.safetensors --axes_dims_rope 4,6,6 \
	    --layout diffusers --max_shard_size 100K --to $(BUILD)/flux-interop/dev && \
	  $$py scripts/flux_golden.py --roundtrip $(BUILD)/flux-interop/dev --ref tests/data/flux/dev && \
	  $$py scripts/bfl_keys_golden.py --check tests/data/flux/bfl_keys_dev.txt && \
	  $$py scripts/bfl_keys_golden.py --file $(BUILD)/flux-interop/dev.safetensors && \
	  $$py scripts/flux_golden.py --bfl-roundtrip $(BUILD)/flux-interop/dev.safetensors --ref tests/data/flux/dev
	py=$$(scripts/py_deps.sh diffusers) && rm -rf $(BUILD)/quant-interop && mkdir -p $(BUILD)/quant-interop && \
	  $$py scripts/quant_golden.py $(BUILD)/quant-interop/quant_golden.safetensors && \
	  CT_QUANT_DATA=$(abspath $(BUILD))/quant-interop $(BUILD)/ct_tests quant

# A 200-step LoRA run on int8-quanto / int8-torchao bases against the bf16 base (loss curves within 2%).
.PHONY: lora-quant-long
lora-quant-long: build
	LORA_QUANT_STEPS=200 bash tests/cli_lora_quant.sh $(CTUNER)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

format-check:
	@command -v clang-format >/dev/null || { echo "format-check: clang-format not found: run scripts/deps.sh (Debian package clang-format)"; exit 1; }
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
