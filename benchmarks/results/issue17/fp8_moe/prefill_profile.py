"""Where an FP8 prefill's GPU time goes against bf16: one 4 x 1024-token prefill of a MoE
model (random weights) under the torch profiler, top kernels of each, same process.

    python benchmarks/results/issue17/fp8_moe/prefill_profile.py benchmarks/configs/deepseek-v2-lite
"""

import gc
import sys

import torch

from radixlm.bench.one_batch import EngineRun, profile_step
from radixlm.config import ServerArgs
from radixlm.model_executor.model_runner import create_runner_and_kv
from radixlm.model_executor.runner_config import RunnerConfig


def main(path: str) -> None:
    for flag in (None, "fp8"):
        args = ServerArgs(model_path=path, load_format="dummy", dtype="bfloat16",
                          max_total_tokens=4 * 1100, max_running_requests=4,
                          context_length=1100, quantization=flag)
        runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(args), radix=False)
        prompts = torch.randint(0, runner.model_config.vocab_size, (4, 1024),
                                generator=torch.Generator().manual_seed(0))
        for _ in range(2):                       # warm-up
            run = EngineRun(runner, kv, prompts, 2, 16)
            run.prefill()
            run.release()
        run = EngineRun(runner, kv, prompts, 2, 16)
        print(f"=== {flag or 'bf16'}")
        prof = profile_step(run.prefill, torch.device("cuda"))
        print(f"{flag or 'bf16'}: wall {prof['wall_s'] * 1e3:.1f} ms, GPU busy "
              f"{prof['gpu_busy_s'] * 1e3:.1f} ms")
        for k in prof["kernels"][:10]:
            print(f"  {k['device_us'] / 1e3:8.2f} ms  x{k['count']:4d}  {k['name']}")
        run.release()
        del runner, kv, run
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
