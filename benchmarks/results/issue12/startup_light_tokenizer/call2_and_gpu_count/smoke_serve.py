"""Serve the 8B-shape random model with the bundled tokenizer; stop strings, a regex, a
json_schema chat request (the scheduler's light tokenizer, xgrammar's full one)."""
import json, re, sys, time
import httpx
from radixlm.utils.server_process import launch_server, stop_server
args = sys.argv[1:]
proc, url = launch_server(args, 300, poll_s=0.05)
try:
    info = httpx.get(url + "/get_server_info", timeout=30).json()
    print("engine phases", info.get("engine_startup_phases"))
    r = httpx.post(url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 32, "stop": ["e", "a"], "temperature": 0}}, timeout=120).json()
    print("stop:", r["meta_info"]["finish_reason"], repr(r["text"]))
    r = httpx.post(url + "/generate", json={"text": "Phone:", "sampling_params": {"max_new_tokens": 32, "regex": r"\d{3}-\d{4}", "temperature": 0.8}}, timeout=120).json()
    print("regex:", r["meta_info"]["finish_reason"], repr(r["text"]), bool(re.fullmatch(r"\d{3}-\d{4}", r["text"])))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = httpx.post(url + "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "json"}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, timeout=120).json()
    txt = r["choices"][0]["message"]["content"]; print("json:", r["choices"][0]["finish_reason"], repr(txt))
    print("json valid:", isinstance(json.loads(txt).get("a"), int) if r["choices"][0]["finish_reason"] == "stop" else "n/a")
finally:
    stop_server(proc, timeout_s=60)
