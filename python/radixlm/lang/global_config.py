"""`rl.global_config`: SGLang's `sgl.global_config`, the frontend's process-wide settings, for
the ones radixlm has. Setting any other (SGLang's interpreter switches with no radixlm meaning)
is an AttributeError naming what exists, never silently ignored."""

from __future__ import annotations

from typing import Any

from radixlm.lang.default_backend import get_default_backend, set_default_backend


class GlobalConfig:
    # The settings there are (besides default_backend, a view of set_default_backend)
    _SETTINGS = ("enable_precache_with_tracing",)

    def __init__(self) -> None:
        # run_batch's default `warmup`: cache the prompt prefix its programs share first
        self.enable_precache_with_tracing = True

    @property
    def default_backend(self) -> Any:
        return get_default_backend()

    @default_backend.setter
    def default_backend(self, backend: Any) -> None:
        set_default_backend(backend)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "default_backend" and name not in self._SETTINGS:
            raise AttributeError(f"global_config has no setting {name!r} in radixlm (it has "
                                 f"default_backend, {', '.join(self._SETTINGS)})")
        object.__setattr__(self, name, value)


global_config = GlobalConfig()
