"""A TCP proxy in a process of its own, to stand for a host that hangs.

`python -m tests.proxy TARGET_HOST TARGET_PORT PORT_FILE` listens on a free loopback port
(written to PORT_FILE) and forwards each connection to the target. SIGSTOP it and every
connection through it hangs the way a frozen host or a partition that drops packets does:
the connections stay open, the kernel still takes what is sent, and no byte moves in
either direction. SIGCONT and the bytes held meanwhile go on. (Stopping the server itself
would stop every other test's database too.)
"""

from __future__ import annotations

import os
import socket
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(client: socket.socket, host: str, port: int) -> None:
    try:
        upstream = socket.create_connection((host, port))
    except OSError:
        client.close()
        return
    for a, b in ((client, upstream), (upstream, client)):
        threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main() -> None:
    host, port, port_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.replace(tmp, port_file)
    while True:
        client, _ = listener.accept()
        _serve(client, host, port)


if __name__ == "__main__":
    main()
