"""``relaxc serve``: OpenAI's API over a real-width decoder (``zoo:llama_768_past``: hidden 768, 32,000
tokens, grouped-query heads), driven by the official ``openai`` client: completions and chat, streamed
and not, stop strings, usage, each bad request answered with OpenAI's error body while the server goes
on, a full queue, and continuous batching's promise: concurrent greedy clients with prompts of
different lengths each get what ``generate`` gives that prompt alone, clients leaving half-way."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")

import relaxc  # noqa: E402
from relaxc.benchmarks import stand_in_tokenizer  # noqa: E402
from relaxc.frontend import models  # noqa: E402
from relaxc.runtime import serving  # noqa: E402
from relaxc.runtime.serving.text import Text  # noqa: E402
from tests.helpers import ROOT, env, relaxc_command  # noqa: E402

MAX_LENGTH, SLOTS, NAME = 96, 8, "llama"
EOS = 256  # the stand-in tokenizer's <|endoftext|>


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``serving.app`` run by uvicorn in a thread of this process."""

    def __init__(self, art, tokenizer: str, **options) -> None:
        self.port = _free_port()
        config = uvicorn.Config(serving.app(art, tokenizer, name=NAME, **options), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=120)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def raw(self, path: str, body: bytes | None = None) -> tuple[int, dict]:
        """A request as bytes: the status and the JSON body."""
        request = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    proto = models.fill_light(onnx.load(models.bundled_path("zoo:llama_768_past")))
    art = relaxc.compile(proto, tuning="off", max_length=MAX_LENGTH, max_batch=SLOTS, backends="relaxc")
    tokenizer = stand_in_tokenizer.write(str(tmp_path_factory.mktemp("tokenizer")), art.decoder["vocab"])
    return art, tokenizer


@pytest.fixture(scope="module")
def server(decoder):
    running = Server(*decoder)
    yield running
    running.stop()


def _alone(art, text: Text, ids: list[int], tokens: int) -> str:
    """What ``generate`` alone makes of ``ids``, greedy, ending at EOS: the text a client should get."""
    out = art.generate(np.array([ids]), max_new_tokens=tokens, eos_token_id=EOS)[0, len(ids):].tolist()
    return text.decode(out[:out.index(EOS)] if EOS in out else out)


def test_models_health_and_a_greedy_completion_as_generate_alone(server, decoder):
    art, tokenizer = decoder
    text = Text.read(tokenizer)
    assert [m.id for m in server.client.models.list().data] == [NAME]
    assert server.raw("/health")[0] == 200
    done = server.client.completions.create(model=NAME, prompt="Hello there, server", max_tokens=12, temperature=0)
    ids = text.encode("Hello there, server")
    assert done.choices[0].text == _alone(art, text, ids, 12)
    assert done.usage.prompt_tokens == len(ids) and done.usage.total_tokens == len(ids) + done.usage.completion_tokens
    assert done.choices[0].finish_reason == ("length" if done.usage.completion_tokens == 12 else "stop")


def test_streams_give_the_same_text_in_openais_chunks(server, decoder):
    art, tokenizer = decoder
    whole = server.client.completions.create(model=NAME, prompt=[5, 17, 900, 31000], max_tokens=10, temperature=0)
    chunks = list(server.client.completions.create(model=NAME, prompt=[5, 17, 900, 31000], max_tokens=10,
                                                   temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens and not chunks[-1].choices


def test_chat_renders_the_tokenizers_template(server, decoder):
    art, tokenizer = decoder
    text = Text.read(tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    done = server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=9, temperature=0)
    ids = text.encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
                      "<|im_start|>assistant\n", special_tokens=False)
    assert done.usage.prompt_tokens == len(ids)
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content == _alone(art, text, ids, 9)
    stream = list(server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=9, temperature=0,
                                                        stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == done.choices[0].message.content


def test_a_stop_string_across_tokens_ends_the_text_before_it(server, decoder):
    art, tokenizer = decoder
    text = Text.read(tokenizer)
    ids = [3, 1000, 2000, 3000]
    tokens = art.generate(np.array([ids]), max_new_tokens=20)[0, len(ids):].tolist()
    pieces = [text.decode([t]) for t in tokens]
    at = next(i for i in range(2, 19) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2 and EOS not in tokens[:i + 2])
    stop = pieces[at][-2:] + pieces[at + 1][:2]  # spans the boundary between two tokens
    full = text.decode(tokens)
    want = full[:full.index(stop)]
    for stream in (False, True):
        got = server.client.completions.create(model=NAME, prompt=ids, max_tokens=20, temperature=0, stop=[stop, "\x00never"],
                                               stream=stream)
        if stream:
            got = list(got)
            assert "".join(c.choices[0].text for c in got) == want and got[-1].choices[0].finish_reason == "stop"
        else:
            assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"


def test_sampling_is_seeded_per_request(server):
    """``temperature`` > 0 draws from a generator seeded by the request's ``seed``: the same seed gives the
    same text, under any load; another seed another text; ``top_p`` keeps the most likely alone."""
    def draw(seed, **more):
        return server.client.completions.create(model=NAME, prompt=[7, 8, 9], max_tokens=16, temperature=1.5,
                                                seed=seed, **more).choices[0].text
    first = draw(1)
    assert draw(1) == first and draw(2) != first
    assert draw(3, top_p=1e-9) == server.client.completions.create(model=NAME, prompt=[7, 8, 9], max_tokens=16,
                                                                   temperature=0).choices[0].text


BAD = [  # (body, status, the field the error names)
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ({"model": NAME, "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"model": NAME, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"model": NAME, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"model": NAME, "prompt": "hi", "max_tokens": MAX_LENGTH}, 400, "max_tokens"),
    ({"model": NAME, "prompt": list(range(MAX_LENGTH))}, 400, "prompt"),
    ({"model": NAME, "prompt": [5, 40000]}, 400, "prompt"),
    ({"model": NAME, "prompt": ""}, 400, "prompt"),
    ({"model": NAME, "prompt": "hi", "n": 2}, 400, "n"),
    ({"model": NAME, "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ({"model": NAME, "messages": []}, 400, "messages"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[f"{b.get('model')}-{p}-{i}" for i, (b, _, p) in enumerate(BAD)])
def test_a_bad_request_gets_openais_error_and_the_server_goes_on(server, body, status, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    got, answer = server.raw(path, json.dumps(body).encode())
    assert got == status and answer["error"]["param"] == param and answer["error"]["message"], answer
    assert server.client.completions.create(model=NAME, prompt="ok", max_tokens=2, temperature=0).choices


def test_malformed_json_and_the_clients_errors(server):
    got, answer = server.raw("/v1/completions", b'{"model": "llama", "prompt": ')
    assert got == 400 and "not JSON" in answer["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        server.client.completions.create(model=NAME, prompt="hi", max_tokens=10_000)
    assert server.client.completions.create(model=NAME, prompt="ok", max_tokens=2, temperature=0).choices


def test_a_full_queue_answers_503(decoder):
    full = Server(*decoder, max_queue=0, slots=1)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            full.client.completions.create(model=NAME, prompt="hi", max_tokens=2)
        assert caught.value.status_code == 503 and "wait for a slot" in str(caught.value)
    finally:
        full.stop()


def test_chat_without_a_template_is_refused_completions_still_work(decoder, tmp_path):
    art, _ = decoder
    plain = Server(art, stand_in_tokenizer.write(str(tmp_path), art.decoder["vocab"], chat_template=False), slots=1)
    try:
        with pytest.raises(openai.BadRequestError, match="no chat_template"):
            plain.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
        assert plain.client.completions.create(model=NAME, prompt="hi", max_tokens=2, temperature=0).choices
    finally:
        plain.stop()


@pytest.mark.slow
def test_concurrent_greedy_clients_each_get_generate_alone_while_two_leave(server, decoder):
    """8 greedy clients with prompts of 2 to 40 tokens at once, and 2 more streaming that leave after 3
    chunks: each of the 8 gets exactly its prompt's ``generate`` alone (batch invariance: a row's logits
    do not depend on its step's other rows), and the rows of those that left are freed."""
    art, tokenizer = decoder
    text = Text.read(tokenizer)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 32000, n).tolist() for n in (2, 40, 7, 23, 11, 31, 5, 16)]
    want = [_alone(art, text, p, 24) for p in prompts]
    got: dict[int, str] = {}

    def greedy(i: int) -> None:
        got[i] = server.client.completions.create(model=NAME, prompt=prompts[i], max_tokens=24,
                                                  temperature=0).choices[0].text

    def leaver(i: int) -> None:
        with server.client.completions.create(model=NAME, prompt=prompts[i][:9], max_tokens=60, stream=True) as stream:
            for n, _ in enumerate(stream):
                if n == 3:
                    break  # the client goes away half-way

    threads = [threading.Thread(target=leaver, args=(i,)) for i in (0, 1)]
    threads += [threading.Thread(target=greedy, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert [got.get(i) for i in range(len(prompts))] == want
    for _ in range(100):  # the leavers' rows go at the next step
        if server.raw("/health")[1]["busy"] == 0:
            break
        time.sleep(0.05)
    assert server.raw("/health")[1]["busy"] == 0


def test_a_loaded_artifact_serves_without_onnx_or_the_compile_side(decoder, tmp_path):
    """In a fresh process: ``relaxc.load`` of the export, ``generate``, ``serving.app`` and a completion over
    HTTP, and none of onnx, the passes, the schedules, the front end or the compile side imported."""
    art, tokenizer = decoder
    art.export(tmp_path / "decoder.so")
    script = f"""
import json, sys, threading, time, urllib.request
import relaxc, uvicorn
from relaxc.runtime import serving
art = relaxc.load({str(tmp_path / 'decoder.so')!r})
generated = art.generate([[1, 2, 3]], max_new_tokens=4).shape[1] - 3
server = uvicorn.Server(uvicorn.Config(serving.app(art, {tokenizer!r}, name="m"), port=0, log_level="warning"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.02)
port = server.servers[0].sockets[0].getsockname()[1]
body = json.dumps({{"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{{port}}/v1/completions", body, {{"Content-Type": "application/json"}})
answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
server.should_exit = True
layers = ("relaxc.passes", "relaxc.schedules", "relaxc.frontend", "relaxc.build")
print(json.dumps({{"tokens": answer["usage"]["completion_tokens"], "generated": generated,
                  "imported": sorted(m for m in sys.modules if m == "onnx" or m.startswith(layers))}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"tokens": 4, "generated": 4, "imported": []}


def test_relaxc_serve_starts_answers_and_stops_on_ctrl_c(decoder, tmp_path):
    art, tokenizer = decoder
    art.export(tmp_path / "decoder.so")
    port = _free_port()
    process = subprocess.Popen(relaxc_command("serve", tmp_path / "decoder.so", "--tokenizer", tokenizer, "--port", port,
                                              "--served-model-name", "cli"),
                               env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        for _ in range(600):
            try:
                assert [m.id for m in client.models.list().data] == ["cli"]
                break
            except openai.APIConnectionError:
                time.sleep(0.1)
        assert client.completions.create(model="cli", prompt=[4, 5], max_tokens=3, temperature=0).usage.completion_tokens
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output[-3000:]
    assert "Application shutdown complete" in output, output[-2000:]  # the scheduler closed, its thread joined


def test_a_decoder_without_position_ids_serves_one_row_at_a_time(tmp_path):
    """OPT counts positions over its mask in the graph: rows of their own lengths would get the wrong
    positions, so more than one slot is refused, at start-up; one slot steps as a session does."""
    proto = models.fill_light(onnx.load(models.bundled_path("zoo:opt_past")))
    art = relaxc.compile(proto, tuning="off", max_length=32, max_batch=2, backends="relaxc")
    tokenizer = stand_in_tokenizer.write(str(tmp_path), art.decoder["vocab"]) if art.decoder["vocab"] >= 259 else None
    with pytest.raises(relaxc.UserError, match="position_ids"):
        art.rows()
    if tokenizer:
        with pytest.raises(relaxc.UserError, match="position_ids"):
            serving.app(art, tokenizer)
    rows, session = art.rows(1), art.session()
    prompt = np.arange(3, 10)
    assert np.array_equal(rows.prefill(0, prompt), session.append(prompt[None])[0])
    for token in (5, 8, 13):
        assert np.array_equal(rows.step([0], [token])[0], session.step([token])[0])
