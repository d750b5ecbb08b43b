"""The detokenizer process: turns the scheduler's token ids into text deltas.

Started as `python -m radixlm.managers.detokenizer_process TOKENIZER ENDPOINTS_JSON LOG_LEVEL`
(TOKENIZER "" under --skip-tokenizer-init: outputs pass with empty text).

It keeps one IncrementalDetokenizer per live request (created from the DetokSpec that comes
with the request's first output) and forwards every other message unchanged.
"""

from __future__ import annotations

import logging

import zmq

from radixlm.managers import ipc
from radixlm.managers.detokenizer import IncrementalDetokenizer
from radixlm.managers.messages import BatchReqOutput, DetokSpec, ShutdownReq
from radixlm.utils.gc_freeze import freeze_startup_heap

logger = logging.getLogger(__name__)


class DetokenizerManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def process(self, batch: BatchReqOutput) -> BatchReqOutput:
        if self.tokenizer is None:   # --skip-tokenizer-init: ids only
            for out in batch.outputs:
                out.text, out.detok = "", None
            return batch
        for out in batch.outputs:
            detok = self.states.get(out.rid)
            if detok is None:
                spec = out.detok or DetokSpec()
                detok = IncrementalDetokenizer(self.tokenizer, spec.skip_special_tokens,
                                               spec.spaces_between_special_tokens, spec.stop,
                                               spec.no_stop_trim, spec.min_new_tokens,
                                               spec.stop_regex)
                self.states[out.rid] = detok
            finished = out.finish_reason is not None
            ids = out.new_token_ids
            fr = out.finish_reason
            if (finished and ids and fr.type == "stop" and isinstance(fr.matched, int)
                    and not detok.no_stop_trim):
                ids = ids[:-1]  # the matched stop token's text is not part of the output
            out.text = detok.push(ids, finished)
            out.detok = None
            if finished:
                del self.states[out.rid]
        return batch


def run_detokenizer_process(tokenizer_path: str, endpoints: ipc.IpcEndpoints,
                            log_level: str = "info", trust_remote_code: bool = False) -> None:
    ipc.die_with_parent()
    logging.basicConfig(level=log_level.upper(), format="[%(asctime)s] %(name)s: %(message)s")
    from radixlm.model_executor.light_tokenizer import load_ids_tokenizer
    from radixlm.model_executor.weight_source import set_trust_remote_code

    set_trust_remote_code(trust_remote_code)

    # decodes only; no path: --skip-tokenizer-init
    try:
        manager = DetokenizerManager(load_ids_tokenizer(tokenizer_path) if tokenizer_path
                                     else None)
    except ValueError as e:   # (a bad tokenizer path: the engine reports it, in one line)
        logger.error("detokenizer start-up failed: %s", e)
        ipc.exit_now(1)
    freeze_startup_heap()
    ctx = zmq.Context()
    inbox = ipc.pull_socket(ctx, endpoints.detokenizer)
    outbox = ipc.push_socket(ctx, endpoints.tokenizer)
    while True:
        for msg in ipc.recv_all(inbox, 1.0):
            if isinstance(msg, ShutdownReq):
                inbox.close()
                outbox.close()
                ctx.term()
                return
            if isinstance(msg, BatchReqOutput):
                msg = manager.process(msg)
            ipc.send(outbox, msg)


if __name__ == "__main__":
    import json
    import sys
    run_detokenizer_process(sys.argv[1], ipc.IpcEndpoints(**json.loads(sys.argv[2])), sys.argv[3],
                            trust_remote_code=sys.argv[4:5] == ["1"])
    ipc.exit_now(0)  # all sent and closed: skip the slow interpreter teardown
