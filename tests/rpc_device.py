"""A TVM RPC server for the tests, registered with a tracker on loopback: TVM's own server loop
(``tvm.rpc.server``), which can die at a chosen point of its work instead of after a sleep.

``--die-at-candidate N``: when the server is sent its N-th tuning candidate (a module not named
``relaxc_*``: the probe and relaxc's own measurements do not count), it kills itself, its listening
process and the session, as ``kill -9`` would, so the client sees the connection drop mid-measurement.

    python -m tests.rpc_device --tracker 127.0.0.1:PORT --key KEY [--die-at-candidate N --count-file F]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket

import tvm_ffi

from relaxc.support import tvm_internals


def _die_at_candidate(count_file: str, die_at: int):
    """A session hook whose module loader counts the candidates (in ``count_file``, new: each session
    is a process of its own) and kills the server at the ``die_at``-th."""

    def hook() -> None:
        load = tvm_ffi.get_global_func("tvm.rpc.server.load_module")

        def counted(file_name: str):
            if not os.path.basename(file_name).startswith("relaxc_"):
                with open(count_file, "a+") as f:
                    f.write("x")
                    f.seek(0)
                    count = len(f.read())
                if count == die_at:
                    os.kill(os.getppid(), signal.SIGKILL)  # the listening process
                    os._exit(137)
            return load(file_name)

        tvm_ffi.register_global_func("tvm.rpc.server.load_module", counted, override=True)

    return hook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    parser.add_argument("--key", required=True)
    parser.add_argument("--die-at-candidate", type=int, default=0, help="die when sent this candidate (0: never)")
    parser.add_argument("--count-file", help="where the candidates are counted (with --die-at-candidate)")
    args = parser.parse_args()
    host, port = args.tracker.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    hook = None
    if args.die_at_candidate:
        hook = _die_at_candidate(args.count_file, args.die_at_candidate)
    tvm_internals.serve_rpc(sock, args.key, (host, int(port)), hook)


if __name__ == "__main__":
    main()
