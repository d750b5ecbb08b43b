"""`radixlm serve | generate | router | bench`: the command line.

Server flags use SGLang's names (`--model-path`, `--chunked-prefill-size`, ...), generated from
ServerArgs so that the CLI, Engine(**kwargs) and the server agree on every default.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Sequence

from radixlm.config import ServerArgs
from radixlm.router.config import RouterArgs


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="radixlm", description="A fast LLM serving engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the HTTP server (OpenAI + SGLang native API)")
    ServerArgs.add_cli_args(serve)

    gen = sub.add_parser("generate", help="generate text for one prompt and print it")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt as a user message with the model's chat template")
    gen.add_argument("--system", default=None, help="system message (with --chat)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--seed", type=int, default=None, help="sampling seed")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--stream", action="store_true", help="print text as it is generated")
    gen.add_argument("--json", action="store_true", help="print the whole result as JSON")
    ServerArgs.add_cli_args(gen)

    router = sub.add_parser("router", help="the cache-aware router in front of radixlm or "
                                           "SGLang servers (SGLang's router flags)")
    RouterArgs.add_cli_args(router)

    bench = sub.add_parser("bench", help="benchmarks: radixlm bench NAME --help",
                           description="Runs one of radixlm's benchmarks (each also runs as "
                                       "`python -m radixlm.bench.NAME`); `radixlm bench NAME "
                                       "--help` lists its flags.")
    bench.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    return parser, {"serve": serve, "generate": gen, "router": router, "bench": bench}


def unknown_args_message(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """"unrecognized arguments: --prot 1 (did you mean --port?)": the nearest flag of the
    subcommand for each unknown one."""
    flags = [opt for action in parser._actions for opt in action.option_strings
             if opt.startswith("--")]
    hints: list[tuple[str, str]] = []
    for arg in unknown:
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
            if close:
                hints.append((flag, close[0]))
    message = f"unrecognized arguments: {' '.join(unknown)}"
    if len(hints) == 1:
        message += f" (did you mean {hints[0][1]}?)"
    elif hints:
        message += " (did you mean: " + ", ".join(f"{a} -> {b}" for a, b in hints) + "?)"
    return message


# `radixlm bench NAME ...` runs radixlm.bench.NAME.main(...); each is also `python -m`-runnable.
BENCHMARKS = ("structured", "grammar-fill", "programs", "one-batch", "offline", "serving",
              "headline", "overlap", "router", "hicache", "moe", "moe-tune", "quant", "spec",
              "startup", "extend-kernel", "allreduce", "tp", "gemv", "latency", "sampler")


def _generate(ns: argparse.Namespace) -> int:
    from radixlm.entrypoints.engine import Engine

    args = ServerArgs.from_cli_args(ns)
    engine = Engine(**{k: v for k, v in vars(args).items()})
    try:
        prompt = ns.prompt
        if ns.chat:
            messages = ([{"role": "system", "content": ns.system}] if ns.system else [])
            prompt = engine.apply_chat_template(messages + [{"role": "user", "content": prompt}])
        params = {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature,
                  "top_p": ns.top_p, "top_k": ns.top_k, "min_p": ns.min_p,
                  "repetition_penalty": ns.repetition_penalty, "stop": ns.stop or [],
                  "sampling_seed": ns.seed, "ignore_eos": ns.ignore_eos}
        if ns.stream and not ns.json:
            printed = 0
            for chunk in engine.generate(prompt, params, stream=True):
                sys.stdout.write(chunk["text"][printed:])
                sys.stdout.flush()
                printed = len(chunk["text"])
            sys.stdout.write("\n")
        else:
            out = engine.generate(prompt, params)
            print(json.dumps(out, indent=2) if ns.json else out["text"])
    except ValueError as e:
        print(f"radixlm generate: {e}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()
    return 0


def _as_dp_engine(ns: argparse.Namespace) -> None:
    """An engine started by `serve --dp-size N` (router/dp.py) exits with that process, and
    takes the API key from the environment (where `ps` does not show it)."""
    from radixlm import envs
    parent = envs.dp_parent_pid()
    if parent is not None:
        from radixlm.managers.ipc import die_with_parent
        die_with_parent(parent)
    if ns.api_key is None:
        ns.api_key = envs.api_key()


def main(argv: Sequence[str] | None = None, fast_exit: bool = False) -> int:
    parser, commands = _parser()
    # Unknown flags are reported by the subcommand's parser (its usage, the nearest flag), not
    # by the top-level one, whose usage only lists the subcommands.
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        commands[ns.command].error(unknown_args_message(commands[ns.command], unknown))
    if ns.command == "serve":
        _as_dp_engine(ns)
    try:
        if ns.command == "generate":
            return _generate(ns)
        if ns.command == "bench":
            import importlib
            module = importlib.import_module(f"radixlm.bench.{ns.name.replace('-', '_')}")
            return module.main(ns.args)
        if ns.command == "router":
            from radixlm.router.server import run_router
            code = run_router(RouterArgs.from_cli_args(ns))
        else:
            args = ServerArgs.from_cli_args(ns)
            from radixlm.utils.gpus import check_device_flags
            check_device_flags(args.device, args.attention_backend)
            if args.node_rank > 0:
                from radixlm.entrypoints.ranks import run_follower_node
                code = run_follower_node(args)
            elif args.dp_size > 1:
                from radixlm.router.dp import serve_dp
                code = serve_dp(args)
            else:
                from radixlm.entrypoints.http_server import serve
                code = serve(args)
    except (ValueError, FileNotFoundError) as e:  # the messages name the bad flag
        parser.exit(2, f"radixlm {ns.command}: error: {e}\n")
    if fast_exit:
        # The engine and its children are stopped and the logs flushed: skip the interpreter's
        # teardown of torch and friends (about a second), so the server exits promptly.
        from radixlm.managers.ipc import exit_now
        exit_now(code)
    return code


def run() -> None:
    """The `radixlm` console script."""
    sys.exit(main(fast_exit=True))


if __name__ == "__main__":
    run()
