"""`python -m perdure.agent.local_server`: llama.cpp's OpenAI-compatible server (through the
prebuilt `xllamacpp` wheel) for one GGUF model on 127.0.0.1, in a process of its own.

perdure starts this process and stops it (see `local_model.LocalModel`); it is a separate
process so that a crashed or killed worker never leaves a model half-loaded in itself, and
so that tests can kill it. It exits on SIGTERM/SIGINT, and by itself as soon as the process
that started it is gone (its parent pid changes or its stdin reaches end of file), so a
`kill -9`'d worker does not leave a server behind.

Exit codes: 0 stopped, 2 bad arguments, 3 `xllamacpp` missing, 4 the server did not start
(model unreadable, port taken, ...): the reason is the last line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

READY_PREFIX = "perdure-local-model listening on "


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m perdure.agent.local_server",
        description="Serve one GGUF model over an OpenAI-compatible HTTP API (llama.cpp).",
    )
    parser.add_argument("--model", required=True, help="path of the .gguf file")
    parser.add_argument("--port", type=int, required=True, help="TCP port (0: any free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--alias", default="", help="model name the API reports and accepts")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--temperature", type=float, default=None, help="for requests that set none"
    )
    parser.add_argument(
        "--lookup", type=_lookup, default=None, metavar="N,M",
        help="draft up to M tokens from the prompt's own N-grams (prompt lookup decoding)",
    )  # fmt: skip
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this pid is gone")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="exit when stdin reaches end of file"
    )
    return parser.parse_args(argv)


def _lookup(text: str) -> tuple[int, int]:
    """`N,M` of --lookup: two positive integers."""
    try:
        n, m = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N,M (two integers), got {text!r}") from None
    if n < 1 or m < 1:
        raise argparse.ArgumentTypeError(f"N and M must be at least 1, got {text!r}")
    return n, m


def _watch_stdin(stop: threading.Event) -> None:
    """Set `stop` at end of file on stdin: the parent closed its end (or died)."""
    try:  # the raw fd: a daemon thread blocked in sys.stdin would stall interpreter exit
        while os.read(0, 4096):
            pass
    except (OSError, ValueError):
        pass
    stop.set()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not os.path.isfile(args.model):
        print(f"local model server: no model file at {args.model}", file=sys.stderr, flush=True)
        return 4
    try:
        xlc: Any = importlib.import_module("xllamacpp")
    except ImportError as exc:
        print(
            f"local model server: xllamacpp is not importable ({exc}); "
            "the local model needs: pip install 'perdure[local]'",
            file=sys.stderr,
            flush=True,
        )
        return 3

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    params = xlc.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.n_ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.temperature is not None:  # llama.cpp's own default, 0.8, invents facts
        params.sampling.temp = args.temperature
    if args.alias:
        params.model_alias = {args.alias}
    if args.lookup:  # drafts from the prompt's n-grams, checked by the model in one batch
        params.speculative.types = [
            xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE
        ]
        params.speculative.ngram_simple.size_n, params.speculative.ngram_simple.size_m = args.lookup
    try:
        server = xlc.Server(params)
    except Exception as exc:
        print(f"local model server: did not start: {exc}", file=sys.stderr, flush=True)
        return 4
    address = str(server.listening_address)
    if not address:
        print("local model server: did not start: no listening address", file=sys.stderr)
        return 4
    print(READY_PREFIX + address, flush=True)

    if args.exit_on_stdin_eof:
        threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    while not stop.wait(0.2):  # short: a signal handler runs only between waits
        if args.parent_pid and os.getppid() != args.parent_pid:
            # re-parented: whoever started us is gone, and nobody reads what is being
            # generated; the server's destructor would wait for that generation to end
            # (minutes on a loaded CPU), so exit now: the system frees the model
            os._exit(0)
    del server  # the server's destructor stops its loop and frees the model
    return 0


if __name__ == "__main__":
    sys.exit(main())
