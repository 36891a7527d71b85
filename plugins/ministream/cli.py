"""The `ministream` command. Each subcommand imports its (heavy) module only when it runs,
so `ministream up` works in images without torch and `--help` is instant."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ministream.errors import MiniStreamError

Handler = Callable[[argparse.Namespace], int]


def _demo(args: argparse.Namespace) -> int:
    from ministream.demo import write_demo_checkpoint

    out = write_demo_checkpoint(args.preset, args.output, seed=args.seed)
    print(
        f"wrote demo checkpoint ({args.preset}) to {out}: model.pt, train_config.json, tokenizer/"
    )
    return 0


def _demo_lora(args: argparse.Namespace) -> int:
    from ministream.demo import write_demo_adapter

    out = write_demo_adapter(
        args.base,
        args.output,
        rank=args.rank,
        targets=args.targets,
        alpha=args.alpha,
        seed=args.seed,
    )
    print(f"wrote a random rank-{args.rank} adapter on {', '.join(args.targets)} to {out}")
    return 0


def _convert_lora(args: argparse.Namespace) -> int:
    from ministream.lora_convert import convert_lora

    result = convert_lora(
        args.adapter,
        args.base,
        args.output,
        name=args.name,
        max_rank=args.max_rank,
        dtype=args.dtype,
        force=args.force,
        progress=not args.quiet,
    )
    import shlex

    from ministream.names import serving_max_lora_rank

    # A command a shell takes as written: quoted where needed, no `>=` (a redirect).
    serve = shlex.join(
        [
            "--enable-lora",
            "--max-lora-rank",
            str(serving_max_lora_rank(result.rank)),
            "--lora-modules",
            f"{result.name}={result.output}",
        ]
    )
    print(
        f"converted adapter {result.name!r} (rank {result.rank}, {result.num_tensors} tensors "
        f"on {', '.join(result.modules)}) into {result.output} "
        f"(adapter hash {result.manifest.model_hash[:16]}). Serve with: {serve}"
    )
    return 0


def _convert(args: argparse.Namespace) -> int:
    import logging

    from ministream.convert import convert
    from ministream.raw_layouts import Layout

    handler = logging.StreamHandler()  # stderr: where the checkpoint's weights were found
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("ministream").addHandler(handler)
    logging.getLogger("ministream").setLevel(logging.INFO)
    result = convert(
        args.checkpoint,
        args.train_config,
        args.tokenizer,
        args.output,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
        force=args.force,
        progress=not args.quiet,
        layout=Layout(
            ema=args.ema, state_dict_key=args.state_dict_key, strip_prefix=args.strip_prefix
        ),
    )
    print(
        f"converted {result.num_tensors} tensors into {result.num_shards} shard(s) at "
        f"{result.output} (model hash {result.manifest.model_hash[:16]})"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from ministream.manifest import verify_dir

    manifest = verify_dir(args.model, progress=not args.quiet)
    print(
        f"{args.model}: {len(manifest.files)} files verified "
        f"(model hash {manifest.model_hash[:16]})"
    )
    return 0


def _fetch_adapters(args: argparse.Namespace) -> int:
    import os

    from ministream.adapter_fetch import MODEL_HASH_ENV, AdapterSpec, fetch_all

    outcomes = fetch_all(
        [AdapterSpec.parse(a) for a in args.adapter],
        args.output_dir,
        max_rank=args.max_rank,
        base_model_hash=args.base_model_hash or os.environ.get(MODEL_HASH_ENV) or None,
    )
    for o in outcomes:
        if o.path is None:
            print(f"error: {o.reason}; serving without it", file=sys.stderr)
        else:
            print(f"adapter {o.name!r}: verified, at {o.path}")
    return 0


def _reference(args: argparse.Namespace) -> int:
    import json

    try:
        from ministream_reference.model import ReferenceMiniStream, dump_hidden_states
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "ministream_reference":
            raise
        # The serving images carry the runtime packages only (docs/packaging.md).
        print(
            "error: `ministream reference` runs the reference model, a development tool that "
            "the serving images leave out: install the ministream-serving wheel or a source "
            "checkout with the model extra (pip install 'ministream-serving[model]')",
            file=sys.stderr,
        )
        return 2
    from tokenizers import Tokenizer

    model = ReferenceMiniStream.from_pretrained(args.model)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    ids = tok.encode(args.prompt).ids
    if args.dump:
        dump_hidden_states(model, ids, args.dump)
        print(f"wrote per-layer hidden states for {len(ids)} tokens to {args.dump}")
    out, logprobs = model.generate_greedy(ids, args.max_tokens)
    print(
        json.dumps(
            {
                "prompt_ids": ids,
                "output_ids": out,
                "text": tok.decode(out),
                "top_logprobs": [{str(k): v for k, v in lp.items()} for lp in logprobs],
            }
        )
    )
    return 0


def _upload(args: argparse.Namespace) -> int:
    from ministream.upload import upload

    try:
        result = upload(
            args.model,
            args.url,
            jobs=args.jobs,
            part_size=args.part_size_mib * 1024 * 1024,
            delete_stray=args.delete_stray,
            progress=not args.quiet,
        )
    except KeyboardInterrupt:
        print(
            f"interrupted: {args.url} has no manifest yet, so it does not look complete; "
            "re-run the same command to resume (finished files are skipped)",
            file=sys.stderr,
        )
        return 130
    print(
        f"uploaded {len(result.uploaded)} file(s) ({result.bytes_uploaded / 1e6:.1f} MB), "
        f"skipped {len(result.skipped)} already present, deleted {len(result.deleted)}; "
        f"{result.url} verified (model hash {result.manifest.model_hash[:16]})"
    )
    return 0


def _shard(args: argparse.Namespace) -> int:
    from ministream.convert import parse_size
    from ministream.shard import shard

    result = shard(
        args.model,
        args.tensor_parallel_size,
        args.output,
        pipeline_parallel_size=args.pipeline_parallel_size,
        dtype=args.dtype,
        max_part_bytes=parse_size(args.max_part_size),
        force=args.force,
        progress=not args.quiet,
    )
    info = result.info
    what = (
        "already up to date"
        if result.reused
        else f"written and verified by reloading in {result.seconds:.0f}s"
    )
    print(
        f"{result.output}: shard set for {info.layout} "
        f"of model {info.source_model_hash[:16]} ({len(info.files)} file(s)), {what}. "
        f"Serve: --load-format sharded_state (runai_streamer_sharded on S3) {info.layout.flags}"
    )
    return 0


def _missing_requirements(extra: str) -> list[str]:
    """The distributions of one of our extras that are not installed (none known: [])."""
    from importlib.metadata import PackageNotFoundError, distribution, requires

    try:
        reqs = requires("ministream-serving") or []
    except PackageNotFoundError:  # run from a bare source tree: nothing to compare against
        return []
    missing = []
    for req in reqs:
        name, _, marker = req.partition(";")
        if not re.search(rf"extra\s*==\s*['\"]{extra}['\"]", marker):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip())
        if match is None or match[0] == "ministream-serving":
            continue
        try:
            distribution(match[0])
        except PackageNotFoundError:
            missing.append(match[0])
    return missing


def _up(argv: list[str]) -> int:
    # The launcher starts the sidecar in a subprocess: check the whole extra up front, so the
    # serving image (model,s3 only) fails here with the fix rather than in a child traceback.
    missing = _missing_requirements("sidecar")
    if not missing:
        try:
            from ministream_sidecar.launcher import main as launcher_main
        except ModuleNotFoundError as exc:
            missing = [exc.name or str(exc)]
    if missing:
        print(
            f"error: ministream up needs the sidecar extra (missing: {', '.join(missing)}): "
            "pip install 'ministream-serving[sidecar]'",
            file=sys.stderr,
        )
        return 2
    return launcher_main(argv)


Subparsers = argparse._SubParsersAction  # what add_subparsers returns


def _add_demo(sub: Subparsers) -> None:
    p = sub.add_parser("demo", help="write a deterministic demo checkpoint (raw format)")
    from ministream.presets import PRESET_NAMES, checkpoint_bytes

    sizes = ", ".join(f"{name} {_size(checkpoint_bytes(name))}" for name in PRESET_NAMES)
    p.add_argument(
        "--preset",
        default="seed",
        choices=PRESET_NAMES,
        help=f"model shape (default seed); model.pt sizes: {sizes}",
    )
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_demo)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"~{n / scale:.1f} {unit}"
    return f"{n} B"


def _add_demo_lora(sub: Subparsers) -> None:
    from ministream.names import LORA_TARGETS

    p = sub.add_parser(
        "demo-lora", help="write a random LoRA adapter (training format) for a converted model"
    )
    p.add_argument("--base", required=True, type=Path, help="converted model directory")
    p.add_argument("--output", required=True, type=Path, help="adapter.pt to write")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument(
        "--targets",
        nargs="+",
        default=list(LORA_TARGETS),
        choices=LORA_TARGETS,
        metavar="TARGET",
        help=f"raw matrices to adapt (default all: {' '.join(LORA_TARGETS)})",
    )
    p.add_argument("--alpha", type=float, help="LoRA alpha (default: the rank)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_demo_lora)


def _add_convert_lora(sub: Subparsers) -> None:
    from ministream.names import DEFAULT_MAX_LORA_RANK

    p = sub.add_parser(
        "convert-lora", help="convert a LoRA adapter (adapter.pt) into a directory vLLM serves"
    )
    p.add_argument(
        "--adapter", required=True, type=Path, help="adapter.pt of the training framework"
    )
    p.add_argument(
        "--base", required=True, type=Path, help="the converted model directory it adapts"
    )
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--name", help="the name it is served under (default: the output's name)")
    p.add_argument(
        "--max-rank",
        type=int,
        default=DEFAULT_MAX_LORA_RANK,
        help=f"refuse adapters of a higher rank (default {DEFAULT_MAX_LORA_RANK}); serve with "
        "vLLM's --max-lora-rank at least this",
    )
    p.add_argument("--dtype", default="float32", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--force", action="store_true", help="replace an existing output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_convert_lora)


def _add_convert(sub: Subparsers) -> None:
    p = sub.add_parser("convert", help="convert a raw checkpoint into a servable directory")
    p.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="model.pt (any torch.save file), a torch.distributed.checkpoint directory, a "
        ".safetensors file, or a *.safetensors.index.json (or its directory)",
    )
    p.add_argument("--train-config", required=True, type=Path, help="train_config.json")
    p.add_argument(
        "--tokenizer",
        required=True,
        type=Path,
        help="tokenizer.json or a directory of Hugging Face tokenizer files",
    )
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--max-shard-size", default="2GB", help="e.g. 2GB, 500MiB (default 2GB)")
    p.add_argument(
        "--ema", action="store_true", help="convert the EMA weights stored beside the live ones"
    )
    p.add_argument(
        "--state-dict-key",
        metavar="KEY",
        help="dotted path to the state dict in the checkpoint, e.g. checkpoint.model "
        "(default: found under model, state_dict, module or model_state_dict)",
    )
    p.add_argument(
        "--strip-prefix",
        metavar="PREFIX",
        help="take the tensors named PREFIX..., without PREFIX (default: strip _orig_mod., "
        "module. or model. when every name starts with it)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_convert)


def _add_verify(sub: Subparsers) -> None:
    p = sub.add_parser("verify", help="check a converted directory against its manifest")
    p.add_argument("model", type=Path)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_verify)


def _add_fetch_adapters(sub: Subparsers) -> None:
    p = sub.add_parser(
        "fetch-adapters",
        help="copy LoRA adapters into a directory, admitting only verified ones (pod init step)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        required=True,
        metavar="NAME=URI",
        help="an adapter: s3://BUCKET/PREFIX or a directory (repeat for each)",
    )
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--max-rank", required=True, type=int, help="vLLM's --max-lora-rank")
    p.add_argument(
        "--base-model-hash",
        help="hash of the served base (default: $MINISTREAM_MODEL_HASH; unset: not checked)",
    )
    p.set_defaults(handler=_fetch_adapters)


def _add_reference(sub: Subparsers) -> None:
    p = sub.add_parser("reference", help="greedy tokens/logprobs from the reference model")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--prompt", default="The model")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dump", type=Path, help="write per-layer hidden states (torch.save)")
    p.set_defaults(handler=_reference)


def _add_upload(sub: Subparsers) -> None:
    p = sub.add_parser(
        "upload",
        help="upload a converted model or shard set to S3 (resumable; manifest written last)",
    )
    p.add_argument("model", type=Path, help="converted model directory or shard set")
    p.add_argument("url", help="s3://BUCKET/PREFIX (endpoint/credentials: standard AWS env)")
    p.add_argument("--jobs", type=int, default=8, help="parallel transfers (default 8)")
    p.add_argument(
        "--part-size-mib", type=int, default=64, help="multipart part size in MiB (default 64)"
    )
    p.add_argument(
        "--delete-stray",
        action="store_true",
        help="delete *.safetensors under the prefix that the manifest does not list",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_upload)


def _add_shard(sub: Subparsers) -> None:
    p = sub.add_parser(
        "shard",
        help="pre-shard a model for one tensor x pipeline-parallel layout (vLLM sharded_state)",
    )
    p.add_argument("--model", required=True, help="converted model directory or s3:// URL")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, required=True)
    p.add_argument(
        "--pipeline-parallel-size",
        "-pp",
        type=int,
        default=1,
        help="pipeline stages (default 1); one rank process per tensor x pipeline rank",
    )
    p.add_argument("--output", required=True, help="directory or s3:// URL")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        help="dtype of the shards; serve with the same --dtype (default: the model's own dtype)",
    )
    p.add_argument(
        "--max-part-size",
        default="5GB",
        help="split each rank's state into files of at most this size (default 5GB)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace an output that holds something else"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_shard)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ministream", description=__doc__)
    from ministream.manifest import converter_version

    parser.add_argument("--version", action="version", version=f"ministream {converter_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_demo,
        _add_demo_lora,
        _add_convert,
        _add_convert_lora,
        _add_verify,
        _add_fetch_adapters,
        _add_reference,
        _add_upload,
        _add_shard,
    ):
        add(sub)
    from ministream import compile_cache

    compile_cache.add_parser(sub)

    # Listed for --help only: main() hands everything after `up` to the launcher's own
    # parser (argparse's REMAINDER does not take a leading `--model`).
    sub.add_parser(
        "up",
        help="serve a model locally: vLLM + the sidecar (`ministream up --help`)",
        add_help=False,
    )

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["up"]:
        return _up(argv[1:])
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (MiniStreamError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was left half-written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
