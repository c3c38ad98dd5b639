"""Text generation from decoders with past (zoo:gpt2_past, zoo:llama_past and six more: two layers, exported by
benchmarks/export_decoders.py with TorchScript and with optimum): recognition and its refusals, greedy decoding
equal to onnxruntime's own loop over the same export, sessions, streaming, export and load, seeded sampling,
errors."""

import json
import threading

import numpy as np
import onnx
import pytest
from onnx import helper

import relaxc
from relaxc.frontend import decoder, models
from relaxc.runtime.generation import sampling
from relaxc.support.cache_layout import CacheLayout
from tests import reference
from tests.helpers import call_program

DECODERS = ("gpt2_past", "llama_past")  # learned positions, no position_ids; rotary, grouped queries
MAX_LENGTH, MAX_BATCH, PROMPT = 64, 4, 32


@pytest.fixture(scope="module", params=DECODERS)
def compiled(request):
    art = relaxc.compile(f"zoo:{request.param}", tuning="off", max_length=MAX_LENGTH, max_batch=MAX_BATCH)
    proto = models.fill_light(onnx.load(models.bundled_path(f"zoo:{request.param}")))
    # GPT-2's export counts positions from the cache's length: onnxruntime runs it reading position_ids, as relaxc
    return art, reference.ort_session(decoder.with_position_ids(proto) or proto)


def _prompts(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` prompts of up to PROMPT tokens, left-padded to PROMPT with a mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 512, (batch, PROMPT))
    mask = np.ones_like(ids)
    for row in range(1, batch):
        mask[row, :3 * row] = 0
    return ids, mask


def _ort_tokens(art, session, ids, mask, new):
    return reference.ort_greedy(session, ids, mask, new, [tuple(pair) for pair in art.decoder["pairs"]])


def _agrees(got: np.ndarray, want: np.ndarray, logits: list[np.ndarray]) -> None:
    """Equal tokens, or a first difference where onnxruntime's own top two logits tie within 1e-4 of
    max|logit| (a choice either runtime may make)."""
    if np.array_equal(got, want):
        return
    row, column = (int(i[0]) for i in np.nonzero(got != want))
    step = logits[column - (want.shape[1] - len(logits))][row]
    top = np.sort(step)[-2:]
    assert top[1] - top[0] <= 1e-4 * np.abs(step).max(), f"row {row} differs at token {column}"


@pytest.mark.parametrize("batch", [1, MAX_BATCH])
def test_greedy_decoding_equals_onnxruntimes_loop(compiled, batch):
    art, session = compiled
    ids, mask = _prompts(batch)
    got = art.generate(ids, mask, max_new_tokens=MAX_LENGTH - PROMPT)
    assert got.dtype == np.int64 and got.shape == (batch, MAX_LENGTH)
    assert np.array_equal(got[:, :PROMPT], ids)
    _agrees(got, *_ort_tokens(art, session, ids, mask, MAX_LENGTH - PROMPT))
    reference.assert_relaxc_ran(art)


def test_each_row_of_a_left_padded_batch_generates_what_it_generates_alone(compiled):
    """transformers' rule: padding changes no row's tokens. GPT-2's TorchScript export looks its positions up
    by the cache's length, the same for every row; relaxc feeds the lookup positions counted over the mask."""
    art, _ = compiled
    ids, mask = _prompts(MAX_BATCH)
    together = art.generate(ids, mask, max_new_tokens=16)
    for row in range(MAX_BATCH):
        real = ids[row, mask[row].astype(bool)]
        np.testing.assert_array_equal(together[row, PROMPT:], art.generate(real, max_new_tokens=16)[0, len(real):])


def test_a_padded_batch_is_refused_where_no_positions_can_be_fed():
    s = relaxc.compile(_positions_by_length(), tuning="off", max_length=MAX_LENGTH, max_batch=2).session()
    ids, mask = _prompts(2)
    with pytest.raises(relaxc.UserError, match="counts positions from the cache's length"):
        s.append(ids, mask)
    s.append(ids)  # rows of equal length: right


def _positions_by_length() -> onnx.ModelProto:
    """zoo:gpt2_past with its position lookup behind an Identity: relaxc finds nothing to feed."""
    proto = models.fill_light(_proto("gpt2_past"))
    at, lookup = next((i, n) for i, n in enumerate(proto.graph.node)
                      if n.op_type == "Gather" and n.input[0].endswith("wpe.weight"))
    proto.graph.node.insert(at, helper.make_node("Identity", [lookup.input[1]], ["hidden_positions"]))
    lookup.input[1] = "hidden_positions"
    return proto


def test_greedy_tokens_equal_transformers_generate_alone_and_left_padded(compiled, request):
    reference.assert_generates_as_transformers(compiled[0], request.node.callspec.params["compiled"])


def test_the_report_describes_the_decoder(compiled):
    art, _ = compiled
    report = art.report()
    assert report["decoder"]["max_length"] == MAX_LENGTH and report["decoder"]["max_batch"] == MAX_BATCH
    assert report["empty_dims"] == [report["decoder"]["dims"]["past"]]
    assert len(report["decoder"]["pairs"]) == 4 and report["decoder"]["vocab"] == 512


def test_each_step_writes_the_cache_in_place(compiled):
    """The step's program takes one cache per past and writes its rows in place: no Concat copies
    the cache and no present comes out; a session allocates its cache once, at its first append."""
    art, _ = compiled
    main = art.ir("fuse")[art.ir("fuse").index("def main"):]
    d = art.decoder
    assert main.count("R.call_tir_inplace(cls.append_rows") == len(d["pairs"]) and "past_key_values" not in main
    # GPT-2's heads and Llama's grouped ones: every attention product reads its cache, keys transposed
    assert art.report()["kv_cache"]["caches"] == art.report()["kv_cache"]["read_in_place"] == len(d["pairs"])
    cache = CacheLayout.from_json(d["cache"])
    assert sorted(cache.transposed) == sorted(past for past, _ in d["pairs"] if past.endswith(".key"))
    assert cache.pasts == tuple(past for past, _ in d["pairs"])
    assert cache.rows >= MAX_LENGTH and "def decode(" in art.ir("fuse")
    assert main.split("\n")[0].endswith("-> R.Tuple(R.Tensor((batch, 1, 512), dtype=\"float32\")):")  # the last position
    assert (cache.heads, cache.dim) == tuple(d["cache_shape"]) and cache.dtype == "float32"
    assert cache.bytes(MAX_BATCH) == len(d["pairs"]) * MAX_BATCH * cache.heads * cache.rows * cache.dim * 4
    s = art.session()
    assert s.cache_bytes == 0
    s.append(_prompts(2)[0])
    allocated = s.cache_bytes
    assert allocated == cache.bytes(2)
    s.step([1, 2])
    assert s.cache_bytes == allocated and s.length == PROMPT + 1


def test_the_programs_refuse_a_step_past_a_cache_of_exactly_max_length_rows(compiled):
    """max_length 64, a whole number of vectors: the cache has no rows beyond it, and a step at its end is an
    InputError from the compiled code (the profile's step at 64 of 64 rows corrupted the heap)."""
    art, _ = compiled
    assert CacheLayout.from_json(art.decoder["cache"]).rows == MAX_LENGTH
    call_program(art, "decode", MAX_LENGTH - 1, 1)
    for function, past, sequence in (("decode", MAX_LENGTH, 1), ("main", MAX_LENGTH - 4, 5), ("decode", -1, 1)):
        with pytest.raises(relaxc.InputError, match=f"outside the cache's {MAX_LENGTH} rows"):
            call_program(art, function, past, sequence)
    s = art.session()
    s.append(np.ones((1, MAX_LENGTH), np.int64))
    with pytest.raises(relaxc.UserError, match="over max_length=64"):
        s.step_arguments([1])


def test_a_session_keeps_its_cache_between_calls(compiled):
    art, _ = compiled
    ids, _ = _prompts(1)
    whole = art.generate(ids, max_new_tokens=8)
    s = art.session()
    logits = s.append(ids[:, :20])
    logits = s.append(ids[:, 20:])  # a second turn extends the first
    tokens = []
    for _ in range(8):
        tokens.append(int(np.argmax(logits[0])))
        logits = s.step([tokens[-1]]) if len(tokens) < 8 else logits
    assert tokens == whole[0, PROMPT:].tolist() and s.length == PROMPT + 7
    s.reset()
    assert s.length == 0 and s.batch is None
    assert np.array_equal(s.append(ids), art.session().append(ids))


def test_two_threads_generate_on_one_artifact_each_in_its_own_session(compiled):
    art, _ = compiled
    prompts = [_prompts(1, seed)[0] for seed in (1, 2)]
    alone = [art.generate(p, max_new_tokens=12) for p in prompts]
    together = [None, None]

    def run(index):
        together[index] = art.generate(prompts[index], max_new_tokens=12)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(a, b) for a, b in zip(alone, together))


class Recorder:
    """transformers' streamer protocol: ``put`` the prompt, then each step's tokens; ``end()``."""

    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(np.asarray(value).tolist())

    def end(self):
        self.calls.append("end")


def test_a_streamer_gets_the_prompt_then_each_token_then_end(compiled):
    art, _ = compiled
    ids, _ = _prompts(1)
    streamer = Recorder()
    got = art.generate(ids, max_new_tokens=5, streamer=streamer)
    assert streamer.calls == [ids.tolist(), *([t] for t in got[0, PROMPT:].tolist()), "end"]


def test_a_row_that_draws_eos_stops_and_is_padded(compiled):
    art, _ = compiled
    ids, mask = _prompts(2)
    free = art.generate(ids, mask, max_new_tokens=10)
    eos = int(free[0, PROMPT + 2])  # row 0's third new token
    got = art.generate(ids, mask, max_new_tokens=10, eos_token_id=eos, pad_token_id=511)
    first = PROMPT + list(free[0, PROMPT:]).index(eos)
    assert np.array_equal(got[0, :first + 1], free[0, :first + 1]) and (got[0, first + 1:] == 511).all()
    stops = [i for i, t in enumerate(free[1, PROMPT:]) if t == eos]
    end = PROMPT + (stops[0] + 1 if stops else 10)
    assert np.array_equal(got[1, :end], free[1, :end])


def test_export_and_load_give_the_same_tokens(compiled, tmp_path):
    art, _ = compiled
    ids, mask = _prompts(2)
    path = tmp_path / "decoder.so"
    art.export(path)
    loaded = relaxc.load(path)
    assert np.array_equal(loaded.generate(ids, mask, max_new_tokens=16), art.generate(ids, mask, max_new_tokens=16))
    lifted = [w.numpy().nbytes for w in art.weights]  # the embedding table among them: 512 tokens x 64
    assert max(lifted) >= 512 * 64 * 4 and (tmp_path / "decoder.weights").stat().st_size >= sum(lifted)


def test_a_manifest_of_another_cache_layout_is_an_export_error(compiled, tmp_path):
    """A program reads its cache in the layout it was compiled for: an export of another layout version
    (or of none, before layouts had one) is refused at load, not run on caches of the wrong shape."""
    art, _ = compiled
    path = tmp_path / "decoder.so"
    art.export(path)
    manifest = json.loads((tmp_path / "decoder.json").read_text())
    for cache in ({**manifest["decoder"]["cache"], "version": 99}, None):
        manifest["decoder"]["cache"] = cache
        (tmp_path / "decoder.json").write_text(json.dumps(manifest))
        with pytest.raises(relaxc.ExportError, match=r"decoder.so keeps its cache in layout version (99|0); .* compile "
                                                     "and export it again"):
            relaxc.load(path)


def test_a_damaged_or_missing_weights_file_is_an_export_error(compiled, tmp_path):
    art, _ = compiled
    path = tmp_path / "decoder.so"
    art.export(path)
    weights = tmp_path / "decoder.weights"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(relaxc.ExportError, match="decoder.weights"):
        relaxc.load(path)
    weights.unlink()
    with pytest.raises(relaxc.ExportError, match="decoder.weights is missing"):
        relaxc.load(path)


def test_sampling_with_a_seed_repeats_its_tokens(compiled):
    art, _ = compiled
    ids, _ = _prompts(1)
    settings = dict(max_new_tokens=16, do_sample=True, temperature=1.5, top_k=50, top_p=0.9, seed=7)
    first, again = art.generate(ids, **settings), art.generate(ids, **settings)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, art.generate(ids, **{**settings, "seed": 8}))


def test_generation_errors_are_named_before_any_work(compiled):
    art, _ = compiled
    ids, _ = _prompts(1)
    with pytest.raises(relaxc.InputError, match="token id 512 is outside the vocabulary 0..511"):
        art.generate(np.array([[1, 512]]))
    with pytest.raises(relaxc.UserError, match="max_new_tokens must be 1..32"):
        art.generate(ids, max_new_tokens=33)
    with pytest.raises(relaxc.UserError, match="more than max_batch=4"):
        art.generate(np.zeros((5, 3), np.int64), max_new_tokens=1)
    with pytest.raises(relaxc.UserError, match="over max_length=64"):
        art.session().append(np.zeros((1, 65), np.int64))
    with pytest.raises(relaxc.UserError, match="temperature must be positive"):
        art.generate(ids, do_sample=True, temperature=0)
    with pytest.raises(relaxc.UserError, match="keeps its cache in place: run it through session"):
        art.run({})


@pytest.mark.parametrize("name", [
    "qwen2_past",  # biases on the query, key and value projections
    "phi3_past",  # fused projections split by computed bounds, a rotary embedding of every dim (an empty part)
    "opt_past",  # positions from the mask's cumulative sum sliced "to the end" from the past length
    "gpt2_optimum", "llama_optimum",  # optimum's exporter: its masks built from ranges of dynamic starts
    "mistral_optimum",  # attention within a sliding window of 16 tokens
])
def test_other_families_decode_as_onnxruntimes_loop_reading_the_cache_in_place(name, tmp_path):
    art = relaxc.compile(f"zoo:{name}", tuning="off", max_length=MAX_LENGTH, max_batch=MAX_BATCH)
    session = reference.ort_session(models.fill_light(onnx.load(models.bundled_path(f"zoo:{name}"))))
    for batch in (1, MAX_BATCH):
        ids, mask = _prompts(batch)
        got = art.generate(ids, mask, max_new_tokens=MAX_LENGTH - PROMPT)
        _agrees(got, *_ort_tokens(art, session, ids, mask, MAX_LENGTH - PROMPT))
    for row in range(1, MAX_BATCH):  # padding changes no row's tokens (transformers' rule)
        real = ids[row, mask[row].astype(bool)]
        np.testing.assert_array_equal(art.generate(real, max_new_tokens=8)[0, len(real):], got[row, PROMPT:PROMPT + 8])
    art.export(tmp_path / "decoder.so")
    assert np.array_equal(relaxc.load(tmp_path / "decoder.so").generate(ids, mask, max_new_tokens=8),
                          got[:, :PROMPT + 8])
    assert art.report()["kv_cache"]["read_in_place"] == len(art.decoder["pairs"])
    # optimum ties GPT-2's embedding to its output layer: main's and decode's gathers read the packed panels
    assert art.report()["tied"]["tied_embeddings"] == (2 if name == "gpt2_optimum" else 0)


def test_a_decoder_the_importer_refuses_is_an_error_not_a_model_onnxruntime_runs(importer_refusing_every_graph):
    """Its cache lives in relaxc's program: the whole-model fallback of other models would generate nothing."""
    with pytest.raises(relaxc.UserError, match="TVM's ONNX importer cannot convert"):
        relaxc.compile("zoo:gpt2_past", tuning="off", max_length=MAX_LENGTH)


def test_every_positions_logits_when_compiled_to_keep_them(compiled):
    art = relaxc.compile("zoo:llama_past", tuning="off", max_length=MAX_LENGTH, max_batch=2, all_logits=True)
    ids, mask = _prompts(2)
    got = art.session().append(ids, mask, all_positions=True)
    session = reference.ort_session(models.fill_light(onnx.load(models.bundled_path("zoo:llama_past"))))
    want = reference.OrtDecoder(session, [tuple(pair) for pair in art.decoder["pairs"]]).append(ids, mask, True)
    assert got.shape == (2, PROMPT, 512)
    reference.assert_matches([got[mask == 1]], [want[mask == 1]])  # padded positions' logits mean nothing
    np.testing.assert_array_equal(art.session().append(ids, mask), got[:, -1])
    with pytest.raises(relaxc.UserError, match="compile it with all_logits=True"):
        compiled[0].session().append(ids, mask, all_positions=True)


def test_a_model_compiled_without_max_length_does_not_generate():
    art = relaxc.compile(reference.small_cnn(), tuning="off")
    with pytest.raises(relaxc.UserError, match="compiled without max_length"):
        art.generate(np.array([[1, 2]]))


def _proto(name: str) -> onnx.ModelProto:
    return onnx.load(models.bundled_path(f"zoo:{name}"))


def test_what_is_not_a_decoder_with_past_is_refused_naming_what_is_missing():
    with pytest.raises(relaxc.UserError, match="not a decoder with past: no input_ids, attention_mask, logits"):
        relaxc.compile("onnx:squeezenet", max_length=16)
    with pytest.raises(relaxc.UserError, match="no input is named past_key_values"):
        relaxc.compile(_without_past(), max_length=16)
    with pytest.raises(relaxc.UserError, match="give max_length too"):
        relaxc.compile("zoo:gpt2_past", max_batch=2)
    with pytest.raises(relaxc.UserError, match="give both"):
        decoder.recognise(_proto("gpt2_past"), 16, kv_inputs=["past_key_values.0.key"])
    with pytest.raises(relaxc.UserError, match="max_length must be a whole number of at least 2"):
        decoder.recognise(_proto("gpt2_past"), 1)
    with pytest.raises(relaxc.UserError, match="max_batch must be a whole number of at least 1"):
        relaxc.compile("zoo:gpt2_past", max_length=16, max_batch=0)
    with pytest.raises(relaxc.UserError, match="dim_bounds bounds batch"):
        relaxc.compile("zoo:gpt2_past", max_length=16, dim_bounds={"batch": 2})


def _without_past() -> onnx.ModelProto:
    """zoo:gpt2_past with its pasts and presents renamed: no optimum naming to find."""
    proto = _proto("gpt2_past")
    renames = {v.name: v.name.replace("past_key_values", "cache_in").replace("present", "cache_out")
               for v in [*proto.graph.input, *proto.graph.output]}
    for value in [*proto.graph.input, *proto.graph.output]:
        value.name = renames[value.name]
    for node in proto.graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    return proto


def test_pairs_named_otherwise_are_found_by_kv_inputs_and_outputs():
    proto = _without_past()
    pasts = [v.name for v in proto.graph.input if v.name.startswith("cache_in")]
    found = decoder.recognise(proto, 16, kv_inputs=pasts, kv_outputs=[p.replace("cache_in", "cache_out") for p in pasts])
    assert [p for p, _ in found.pairs] == pasts and found.bounds() == {"batch": 1, "sequence": 16, "past": 15,
                                                                        "total": 16}


def test_a_present_that_is_not_its_past_extended_is_refused():
    proto = _proto("gpt2_past")
    concat = next(n for n in proto.graph.node if "present.0.key" in n.output)
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]  # new rows first: not an extension
    with pytest.raises(relaxc.UserError, match="present 'present.0.key' is not its past 'past_key_values.0.key' "
                                               "extended along the sequence axis"):
        decoder.recognise(proto, 16)
    concat.output[0], concat.op_type = "elsewhere", "Add"  # ... then made by an Add, through an Identity
    proto.graph.node.append(helper.make_node("Identity", ["elsewhere"], ["present.0.key"]))
    with pytest.raises(relaxc.UserError, match="made by Add"):
        decoder.recognise(proto, 16)


def _with_input(proto: onnx.ModelProto, name: str, dtype: int, dims: list) -> onnx.ModelProto:
    proto.graph.input.append(helper.make_tensor_value_info(name, dtype, dims))
    return proto


def test_an_input_a_session_would_not_feed_is_refused_at_compile_time_naming_it():
    with pytest.raises(relaxc.UserError, match="takes token_type_ids, which generation does not feed"):
        decoder.recognise(_with_input(_proto("gpt2_past"), "token_type_ids", onnx.TensorProto.INT64,
                                      ["batch", "sequence"]), 16)
    with pytest.raises(relaxc.UserError, match="takes use_cache_branch.*--no-post-process"):
        relaxc.compile(_with_input(_proto("llama_past"), "use_cache_branch", onnx.TensorProto.BOOL, [1]),
                       max_length=16)


def _positions_from_cache_position() -> onnx.ModelProto:
    """zoo:llama_past reading ``cache_position [sequence]`` instead of ``position_ids``: each row's
    positions are the cache rows of its tokens (transformers' rule without padding)."""
    proto = models.fill_light(_proto("llama_past"))
    graph = proto.graph
    for node in graph.node:
        node.input[:] = ["positions" if n == "position_ids" else n for n in node.input]
    graph.node.insert(0, helper.make_node("Shape", ["input_ids"], ["ids_shape"]))
    graph.node.insert(1, helper.make_node("Unsqueeze", ["cache_position", "zero_axis"], ["row_positions"]))
    graph.node.insert(2, helper.make_node("Expand", ["row_positions", "ids_shape"], ["positions"]))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "zero_axis"))
    kept = [v for v in graph.input if v.name != "position_ids"]
    del graph.input[:]
    graph.input.extend(kept)
    return _with_input(proto, "cache_position", onnx.TensorProto.INT64, ["sequence"])


def test_cache_position_is_fed_the_rows_of_the_new_tokens():
    proto = _positions_from_cache_position()
    art = relaxc.compile(proto, tuning="off", max_length=MAX_LENGTH)
    assert art.decoder["cache_position"] and not art.decoder["positions"]
    ids, _ = _prompts(1)
    expected = reference.ort_greedy(reference.ort_session(models.fill_light(_proto("llama_past"))), ids,
                                    np.ones_like(ids), 12, [tuple(pair) for pair in art.decoder["pairs"]])
    _agrees(art.generate(ids, max_new_tokens=12), *expected)


def test_settings_resolve_as_transformers_generation_config(tmp_path):
    """transformers' defaults (top-k 50 when sampling), a checkpoint's generation_config.json for what the
    caller leaves out, and the caller's own settings over both."""
    given = dict(max_new_tokens=None, do_sample=None, temperature=None, top_k=None, top_p=None,
                 repetition_penalty=None, eos_token_id=None, pad_token_id=None)
    assert sampling.Sampling().top_k == 50 and sampling.resolved(given, None) == given
    (tmp_path / "generation_config.json").write_text(
        '{"do_sample": true, "top_k": 20, "temperature": 0.7, "eos_token_id": [2, 3], "transformers_version": "5"}')
    settings = sampling.resolved(given | {"temperature": 1.3}, tmp_path)
    assert settings == given | {"do_sample": True, "top_k": 20, "temperature": 1.3, "eos_token_id": [2, 3]}
    with pytest.raises(relaxc.UserError, match="cannot read the generation config"):
        sampling.resolved(given, tmp_path / "missing.json")


def test_a_checkpoints_generation_config_drives_generate(compiled, tmp_path):
    art, _ = compiled
    ids, _ = _prompts(1)
    greedy = art.generate(ids, max_new_tokens=8)
    eos = int(greedy[0, PROMPT + 2])  # the third new token ends the row once it is the EOS
    first = list(greedy[0, PROMPT:]).index(eos)  # (or an earlier one, where it comes before)
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": {eos}, "pad_token_id": 0}}')
    stopped = art.generate(ids, max_new_tokens=8, generation_config=tmp_path)
    assert np.array_equal(stopped, greedy[:, :PROMPT + first + 1])
    sampled = art.generate(ids, max_new_tokens=8, generation_config={"do_sample": True}, seed=3)
    assert np.array_equal(sampled, art.generate(ids, max_new_tokens=8, do_sample=True, top_k=50, seed=3))


def test_greedy_is_the_argmax_after_the_repetition_penalty():
    logits = np.array([[2.0, 3.0, -1.0, 2.9]])
    seen = np.array([[False, True, True, False]])
    rng = np.random.default_rng(0)
    assert sampling.choose(logits, seen, sampling.Sampling(), rng).tolist() == [1]
    assert sampling.choose(logits, seen, sampling.Sampling(repetition_penalty=1.2), rng).tolist() == [3]
    assert sampling.penalized(logits, seen, 2.0).tolist() == [[2.0, 1.5, -2.0, 2.9]]


def test_each_setting_draws_from_the_distribution_it_should():
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    close = lambda got, want: np.testing.assert_allclose(got, [want], atol=1e-12)  # noqa: E731
    close(sampling.distribution(logits, sampling.Sampling(do_sample=True)), [0.5, 0.2, 0.15, 0.1, 0.05])
    close(sampling.distribution(logits, sampling.Sampling(do_sample=True, top_k=2)), [5 / 7, 2 / 7, 0, 0, 0])
    close(sampling.distribution(logits, sampling.Sampling(do_sample=True, top_p=0.8)),
          [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])  # 0.5 + 0.2 < 0.8: the third is needed
    hot = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 0.5
    close(sampling.distribution(logits, sampling.Sampling(do_sample=True, temperature=2.0)), hot / hot.sum())
    # draws follow the distribution: 20,000 of them within 4 standard errors of each probability
    settings = sampling.Sampling(do_sample=True, top_p=0.8)
    rng = np.random.default_rng(1)
    draws = np.concatenate([sampling.choose(np.repeat(logits, 1000, axis=0), np.zeros((1000, 5), bool), settings, rng)
                            for _ in range(20)])
    want = sampling.distribution(logits, settings)[0]
    share = np.bincount(draws, minlength=5) / len(draws)
    assert (np.abs(share - want) <= 4 * np.sqrt(want * (1 - want) / len(draws)) + 1e-12).all()


def test_top_k_and_top_p_keep_what_a_full_sort_keeps():
    """The partitions that spare sorting the vocabulary keep exactly the tokens a full sort keeps: on
    32,000 logits of several spreads, with ties (rounded logits) and a nucleus wider than the first
    tokens ranked (a flat row)."""
    rng = np.random.default_rng(0)

    def sorted_reference(logits, s):
        scores = logits.astype(np.float64) / s.temperature
        if 0 < s.top_k < scores.shape[-1]:
            scores = np.where(scores < np.sort(scores, axis=-1)[:, -s.top_k][:, None], -np.inf, scores)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        if s.top_p < 1.0:
            order = np.argsort(-probs, axis=-1, kind="stable")
            ranked = np.take_along_axis(probs, order, axis=-1)
            keep = np.zeros_like(probs, dtype=bool)
            np.put_along_axis(keep, order, np.cumsum(ranked, axis=-1) - ranked < s.top_p, axis=-1)
            probs = np.where(keep, probs, 0.0)
            probs /= probs.sum(axis=-1, keepdims=True)
        return probs

    rows = [rng.standard_normal(32000) * spread for spread in (0.01, 1.0, 8.0)] + [np.round(rng.standard_normal(32000))]
    logits = np.stack(rows).astype(np.float32)
    for settings in (dict(top_k=50), dict(top_k=0, top_p=0.9), dict(top_k=50, top_p=0.5), dict(top_k=0, top_p=0.999),
                     dict(top_k=3000, top_p=0.95, temperature=0.7)):
        s = sampling.Sampling(do_sample=True, **settings)
        assert np.array_equal(sampling.distribution(logits, s), sorted_reference(logits, s)), settings


def test_the_command_line_streams_tokens_then_speeds(tmp_path):
    from tests.helpers import run_cli

    done = run_cli("generate", "zoo:llama_past", "--tuning", "off", "--max-length", "16", "--prompt-ids", "1,2,3",
                   "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr
    tokens, speeds = done.stdout.strip().splitlines()
    art = relaxc.compile("zoo:llama_past", tuning="off", max_length=16)
    assert [int(t) for t in tokens.split()] == art.generate(np.array([[1, 2, 3]]), max_new_tokens=4)[0, 3:].tolist()
    assert speeds.startswith("prefill: 3 tokens in") and "decode: 4 tokens" in speeds
    refused = run_cli("generate", "zoo:llama_past", "--prompt", "hello")
    assert refused.returncode == 2 and "--prompt TEXT needs --tokenizer DIR" in refused.stderr
    refused = run_cli("generate", "zoo:llama_past", "--prompt-ids", "1")
    assert refused.returncode == 2 and "--max-length N" in refused.stderr


def test_the_command_line_profiles_a_decode_step():
    from tests.helpers import run_cli

    done = run_cli("profile", "zoo:gpt2_past", "--tuning", "off", "--max-length", "64", "--cached", "40", "--top", "0")
    assert done.returncode == 0, done.stderr
    assert "one decode step with 40 tokens cached" in done.stdout
    assert "append_rows" in done.stdout and "dense_packed" in done.stdout  # the decode program's kernels
