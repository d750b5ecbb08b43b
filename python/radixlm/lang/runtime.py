"""`Runtime(model_path=..., **server_args)`: SGLang's frontend shortcut that starts a server for
a script and is its backend, here `radixlm serve` in a child process:

    runtime = rl.Runtime(model_path="...")      # any ServerArgs field as a keyword
    rl.set_default_backend(runtime)
    ...
    runtime.shutdown()

It is a RuntimeEndpoint of that server (`runtime.url`, `runtime.endpoint`). The server runs in
its own process group and is stopped at shutdown() or when the script exits.
"""

from __future__ import annotations

import atexit
import subprocess
import sys
from typing import Any

from radixlm.lang.backends.runtime_endpoint import RuntimeEndpoint


class Runtime(RuntimeEndpoint):
    def __init__(self, model_path: str | None = None, log_level: str = "error",
                 timeout_s: float = 600.0, launch_timeout: float | None = None,
                 **server_args: Any):
        """`launch_timeout` (SGLang's name) is `timeout_s`: how long the server may take to
        start."""
        from radixlm.config import ServerArgs
        from radixlm.utils.server_process import free_port, wait_healthy

        if launch_timeout is not None:
            timeout_s = launch_timeout
        server_args.setdefault("port", free_port())
        # (checked here: a bad setting fails in this process, naming its flag)
        args = ServerArgs.from_kwargs(model_path=model_path, log_level=log_level,
                                      **server_args)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "radixlm.launch_server", *args.to_cli_args()],
            start_new_session=True)
        url = f"http://{args.host}:{args.port}"
        wait_healthy(self.process, url, timeout_s)
        atexit.register(self.shutdown)
        try:
            super().__init__(url)
        except Exception:
            self.shutdown()
            raise

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def endpoint(self) -> RuntimeEndpoint:
        return self

    def __repr__(self) -> str:
        return f"Runtime({self.base_url!r})"

    def shutdown(self) -> None:
        """Stop the server (and its scheduler and detokenizer processes)."""
        from radixlm.utils.server_process import stop_server
        atexit.unregister(self.shutdown)
        super().shutdown()
        stop_server(self.process)
