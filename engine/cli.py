"""`radixgate generate` and `radixgate engine`: the engine's own commands."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Iterator

import torch

from engine import cpu_isa
from engine.engine import Engine, EngineConfig
from engine.errors import EngineError, InvalidParallelism
from engine.kv_pool import DEFAULT_SWA_RATIO
from engine.models.loader import LoadedModel, auto_cpu_dtype, default_dtype, load_model
from engine.native import kernel_simd
from engine.protocol import Extend, Failed, Finished, TokenChunk
from engine.reference import GenerationStats, reference_stream
from engine.sampling_params import SamplingParams
from engine.worker import LoopHook

MIB = 1 << 20


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m, "
                             "gemma3-270m, a .gguf file or an HF folder (default: "
                             "$RADIXGATE_MODEL, else qwen2.5-coder-1.5b)")
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "fp32", "bf16", "mixed", "int8"],
                        help="compute dtype; int8: a GGUF's codes with int8 activation rows, "
                             "the rest fp32; mixed: int8 for codes, bf16 for dense "
                             "projections and the KV pool; fp32: codes dequantised in "
                             "registers, fp32 rows; auto: bf16 on CUDA, mixed on a CPU with "
                             "bf16 instructions (AVX512-BF16/AMX), else int8")
    parser.add_argument("--no-packed-weights", action="store_true",
                        help="the dense torch reference: every GGUF tensor dequantised at load "
                             "(several times the memory), instead of computing from the "
                             "file's own codes")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument("--kv-memory", type=int, default=1024, metavar="MIB",
                        help="memory for the paged KV pool in MiB (default 1024)")
    parser.add_argument("--host-kv-memory", type=int, default=0, metavar="MIB",
                        help="a host-memory KV tier: pages evicted from the pool are kept here "
                             "and loaded back on a hit instead of recomputed (default 0: none)")
    parser.add_argument("--kv-disk", type=int, default=0, metavar="MIB",
                        help="write pinned branch heads' KV to files (at most MIB), so a "
                             "restarted worker loads it instead of recomputing (default 0: off)")
    parser.add_argument("--kv-dir", default=None, metavar="PATH",
                        help="where --kv-disk writes (default: <state dir>/kv under `serve`, "
                             "./radixgate-kv for `engine`)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    parser.add_argument("--deterministic", action="store_true",
                        help="every forward on the decode path: a token's logits are the same "
                             "bits whatever was cached, chunked, batched or drafted (slower "
                             "prefill; CPU only)")
    parser.add_argument("--no-swa-memory", action="store_true",
                        help="keep full-length KV for sliding-window layers (the reference); "
                             "by default they hold only the window, given back as it moves")
    parser.add_argument("--swa-kv-ratio", type=float, default=DEFAULT_SWA_RATIO, metavar="R",
                        help="sliding-window layers' pages per full-attention page "
                             f"(default {DEFAULT_SWA_RATIO})")
    parser.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                        help="longest sequence served, prompt plus output (default: the "
                             "model's context length); a longer prompt is refused (400)")
    parser.add_argument("--max-running", type=int, default=32)
    parser.add_argument("--max-batch-tokens", type=int, default=1024,
                        help="token budget per step (decodes + prefill chunks)")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="disable the radix prefix cache (every request recomputes)")
    parser.add_argument("--attention-backend", default="auto",
                        help="torch, torch_sdpa, triton, flash_attn or auto (default: "
                             "flash_attn or triton on CUDA, torch on the CPU)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda or cuda:N; --reference stays on the CPU")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="run decode steps eagerly on CUDA instead of replaying CUDA graphs")
    parser.add_argument("--spec", default="suffix", metavar="MODE",
                        help='speculative drafting: "suffix" (from the trajectory, default), '
                             '"draft:<model path>" (a smaller model, same tokenizer), '
                             '"eagle3:<head folder>" (an EAGLE-3 head in the public format, '
                             'drafting a chain), "eagle3+suffix:<head folder>" (the head, and '
                             'the trajectory where it re-emits text) or "none"')
    parser.add_argument("--max-draft-len", type=int, default=8,
                        help="most draft tokens verified per request per step")
    parser.add_argument("--draft-topk", type=int, default=1, metavar="K",
                        help="eagle3 modes: draft a tree, expanding the K best nodes of each "
                             "depth into K children each (1: a chain, default); the "
                             "--max-draft-len best nodes are verified in one forward")
    parser.add_argument("--draft-steps", type=int, default=0, metavar="D",
                        help="eagle3 tree depth (default: --max-draft-len)")
    parser.add_argument("--tp", type=int, default=1, metavar="N",
                        help="tensor parallelism: split the model's heads, KV heads, MLP and "
                             "experts over N ranks (processes on this host: one GPU each "
                             "from --device's on, or the CPU's threads shared among them); "
                             "N must divide the heads and KV heads (default 1)")
    parser.add_argument("--draft-backoff", type=int, default=16, metavar="N",
                        help="after 4 drafts in a row that miss, skip drafting for 1, 2, 4 .. N "
                             "decode steps (an accepted token resets it). 0: draft every step")


def add_disagg_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--disagg-min-tokens", type=int, default=512, metavar="N",
                        help="disaggregated prefill: a turn with at least N prompt tokens "
                             "uncached on its decode worker is prefilled on a prefill worker "
                             "(default 512)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(page_size=args.page_size, kv_memory_bytes=args.kv_memory * MIB,
                        max_running=args.max_running, max_batch_tokens=args.max_batch_tokens,
                        enable_prefix_cache=not args.no_prefix_cache,
                        attention_backend=args.attention_backend, spec=args.spec,
                        max_draft_len=args.max_draft_len, draft_backoff=args.draft_backoff,
                        draft_topk=args.draft_topk, draft_steps=args.draft_steps,
                        device=args.device,
                        cuda_graphs=not args.no_cuda_graphs,
                        host_kv_memory_bytes=args.host_kv_memory * MIB,
                        kv_dir=args.kv_dir or "radixgate-kv", kv_disk_bytes=args.kv_disk * MIB,
                        max_context=args.max_context, swa_memory=not args.no_swa_memory,
                        swa_ratio=args.swa_kv_ratio, deterministic=args.deterministic,
                        tp=args.tp)


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("generate", help="generate text for one prompt, streamed to stdout")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as one user message with the model's chat template")
    p.add_argument("--reference", action="store_true",
                   help="use the dense reference forward instead of the paged engine")
    add_engine_args(p)
    p.set_defaults(func=generate_main)

    e = sub.add_parser("engine", help="run an engine worker process (ZeroMQ)")
    e.add_argument("--host", default="127.0.0.1")
    e.add_argument("--port", type=int, default=5557)
    e.add_argument("--prefill-peer", action="append", default=[], metavar="tcp://HOST:PORT",
                   help="a worker that prefills long deltas for this one and sends their KV "
                        "over torch.distributed (repeatable; every worker can be one)")
    add_disagg_args(e)
    add_engine_args(e)
    e.set_defaults(func=engine_main)


def _load(args: argparse.Namespace) -> LoadedModel:
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = args.dtype
    device = getattr(args, "device", "cpu")
    if dtype == "auto" and device == "cpu":
        # default_dtype's CPU choice, read once here with its reason for the log.
        name, choice = auto_cpu_dtype()
        dtype = choice.dtype
        print(f"radixgate: CPU class {name}{cpu_isa.cap_note()}: --dtype auto runs "
              f"{choice.dtype} ({choice.why}); C kernels built for {kernel_simd()}",
              file=sys.stderr, flush=True)
    elif dtype == "auto":
        dtype = default_dtype(device)
    return load_model(args.model, dtype, packed=not args.no_packed_weights)


def _engine_tokens(engine: Engine, prompt_ids: list[int], params: SamplingParams,
                   stats: GenerationStats) -> Iterator[str]:
    engine.submit(Extend(uuid.uuid4().hex, "cli", None, prompt_ids, params))
    started = time.perf_counter()
    while engine.has_work:
        for message in engine.step():
            if isinstance(message, TokenChunk):
                yield message.text
            elif isinstance(message, Finished):
                stats.prompt_len, stats.output_len = message.prompt_len, message.output_len
                stats.prefill_s = message.timings.ttft_s
                stats.decode_s = message.timings.decode_s
                stats.finish_reason = message.finish_reason
            elif isinstance(message, Failed):
                raise EngineError(message.message)
    stats.decode_s = stats.decode_s or time.perf_counter() - started


def generate_main(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        loaded = _load(args)
        tok = loaded.tokenizer
        if args.chat and tok.chat_template is None:
            raise EngineError("this model has no chat template; drop --chat")
        text = (tok.chat_template.render([{"role": "user", "content": args.prompt}],
                                         add_generation_prompt=True)
                if args.chat and tok.chat_template is not None else args.prompt)
        prompt_ids = tok.encode(text)
        if not args.chat and tok.add_bos_token and tok.bos_token_id is not None:
            prompt_ids = [tok.bos_token_id, *prompt_ids]
        stats = GenerationStats()
        if args.reference:
            decoder = tok.stream_decoder()
            pieces: Iterator[str] = (decoder.feed(t) for t in reference_stream(
                loaded.model, prompt_ids, params, eos_token_ids=tok.stop_token_ids, stats=stats))
        else:
            engine = Engine(loaded, engine_config_from_args(args))
            pieces = _engine_tokens(engine, prompt_ids, params, stats)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    except EngineError as exc:
        print(f"radixgate: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    print(
        f"radixgate: prompt {stats.prompt_len} tokens, prefill {stats.prefill_s:.2f} s "
        f"({stats.prompt_len / max(stats.prefill_s, 1e-9):.0f} tok/s), "
        f"{stats.output_len} tokens at {stats.decode_tok_s:.1f} tok/s decode, "
        f"finish: {stats.finish_reason}",
        file=sys.stderr,
    )
    return 0


def engine_main(args: argparse.Namespace) -> int:
    from engine.server import serve_engine

    try:
        loaded = _load(args)
        engine = Engine(loaded, engine_config_from_args(args))
        hooks = disagg_hooks(engine, args)
    except EngineError as exc:
        print(f"radixgate engine: error: {exc}", file=sys.stderr)
        return 2
    try:
        serve_engine(engine, args.host, args.port, hooks)
    finally:
        engine.close()
    if engine.tp is not None and engine.tp.has_failed:
        print("radixgate engine: error: a tensor-parallel rank failed; exiting",
              file=sys.stderr)
        return 1
    return 0


def disagg_hooks(engine: Engine, args: argparse.Namespace) -> list[LoopHook]:
    """Every worker can prefill for others; one with --prefill-peer also pulls from them.
    Not a tensor-parallel worker yet (its KV is split over its ranks)."""
    from engine.disagg.decode_side import KvPuller
    from engine.disagg.prefill_side import KvServer

    if engine.tp is not None:
        if args.prefill_peer:
            raise InvalidParallelism("--tp does not run with disaggregated prefill "
                                     "(--prefill-peer) yet")
        return []

    hooks: list[LoopHook] = [KvServer(engine, args.host)]
    if args.prefill_peer:
        hooks.append(KvPuller(engine, args.prefill_peer, host=args.host,
                              min_tokens=args.disagg_min_tokens))
    return hooks
