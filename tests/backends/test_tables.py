"""Gathered embedding tables (qtts.plans.plan reads them, qtts.export.write writes them): fp32/fp16/int8
storage round trips, the int8 rows' SNR, stacked-table indexing, a bundle exported with int8 tables runs
and stays close to fp32."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from export.test_graph_nodes import FLAGS
from qtts.cli import main as qtts_main
from qtts.errors import InputError
from qtts.export.write import quantize_rows, save_table
from qtts.plans.plan import QuantTable, load_table, storage_of


def _snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - test) ** 2), 1e-30)))


@pytest.mark.parametrize("storage", ["fp32", "fp16", "int8"])
def test_round_trip_by_storage(storage, tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.standard_normal((300, 64)).astype(np.float32) * 0.02
    path = str(tmp_path / "t.npy")
    save_table(path, arr, storage)
    table = load_table(path)
    assert storage_of(table) == storage and table.shape == arr.shape
    ids = np.array([0, 7, 299, 7])
    rows = np.asarray(table[ids], dtype=np.float32)
    floor = {"fp32": 200.0, "fp16": 60.0, "int8": 38.0}[storage]
    assert _snr_db(arr[ids], rows) >= floor
    assert sorted(os.listdir(tmp_path)) == (["t.npy", "t.scale.npy"] if storage == "int8" else ["t.npy"])


def test_int8_rows_keep_about_42_db_on_gaussian_rows():
    rng = np.random.default_rng(1)
    arr = rng.standard_normal((512, 2048)).astype(np.float32)
    data, scale = quantize_rows(arr)
    assert data.dtype == np.int8 and scale.shape == (512,) and np.abs(data).max() == 127
    snr = _snr_db(arr, data.astype(np.float32) * scale[:, None])
    assert 39.0 <= snr <= 46.0, snr  # 20 log10(127 sqrt(12) / absmax-in-sigma), absmax ~ 3.5 sigma


def test_stacked_table_index_then_rows_equals_dequantized_whole(tmp_path):
    rng = np.random.default_rng(2)
    arr = rng.standard_normal((3, 50, 16)).astype(np.float32)
    path = str(tmp_path / "s.npy")
    save_table(path, arr, "int8")
    table = load_table(path)
    whole = np.asarray(table)
    sub = table[1]
    assert isinstance(sub, QuantTable) and sub.shape == (50, 16)
    np.testing.assert_array_equal(sub[[4, 9]], whole[1][[4, 9]])
    np.testing.assert_array_equal(table[np.array([0, 2])], whole[[0, 2]])
    assert _snr_db(arr, whole) >= 38.0


def test_all_zero_rows_and_missing_scales(tmp_path):
    path = str(tmp_path / "z.npy")
    save_table(path, np.zeros((4, 8), np.float32), "int8")
    assert not np.asarray(load_table(path)).any()
    os.unlink(str(tmp_path / "z.scale.npy"))
    with pytest.raises(InputError, match="no scales .*re-export"):
        load_table(path)
    with pytest.raises(InputError, match="unknown table storage 'int3'"):
        save_table(path, np.zeros((4, 8), np.float32), "int3")


def _export(snapshot: str, out: str, storage: str, tiny_bundle):
    """A talker + predictor bundle (no batch graphs) with ``storage`` tables; returns (its folder, its
    backend). fp32 tables (the default) are tests/export/test_graph_nodes.py's bundle: one export for both."""
    from qtts.backends import open as open_components

    if storage == "fp32":
        out = tiny_bundle("custom_voice", *FLAGS)
    else:
        assert qtts_main(["export", "onnx", "--model", snapshot, "-o", out, *FLAGS, "--tables", storage]) == 0
    return out, open_components(snapshot, os.path.join(out, "plan.json")).backend


def test_bundle_with_int8_tables_runs_close_to_fp32_tables(snapshot, tiny_bundle, tmp_path):
    outs = {s: _export(snapshot, str(tmp_path / s), s, tiny_bundle)[1] for s in ("fp32", "int8")}
    with open(os.path.join(tmp_path, "int8", "manifest.json"), encoding="utf-8") as fh:
        assert json.load(fh)["options"]["tables"] == "int8"
    assert os.path.exists(os.path.join(tmp_path, "int8", "tables", "text_embedding.scale.npy"))
    ids = np.array([151644, 77091, 198, 1234, 151672])
    ref, test = outs["fp32"], outs["int8"]
    assert _snr_db(ref.text_embeds(ids), test.text_embeds(ids)) >= 30.0
    codes = np.random.default_rng(3).integers(0, 2048, (4, 16))
    assert _snr_db(ref.frame_embeds(codes), test.frame_embeds(codes)) >= 30.0
    assert _snr_db(ref.codec_embeds(np.array([2155, 2149])), test.codec_embeds(np.array([2155, 2149]))) >= 35.0


def test_predictor_frame_graph_keeps_its_codec_tables_in_fp16_unless_tables_are_fp32(snapshot, tiny_bundle,
                                                                                     tmp_path):
    import onnx

    from qtts.options import SamplingParams

    logits = {}
    for storage in ("fp32", "fp16"):
        out, backend = _export(snapshot, str(tmp_path / storage), storage, tiny_bundle)
        graph = onnx.load(os.path.join(out, "predictor.frame.fp32.onnx"), load_external_data=False).graph
        gathered = {n.input[0] for n in graph.node if n.op_type == "Gather"}
        dtypes = {i.data_type for i in graph.initializer if i.name in gathered and len(i.dims) == 2}
        assert dtypes == {onnx.TensorProto.FLOAT16 if storage == "fp16" else onnx.TensorProto.FLOAT}
        hidden = np.random.default_rng(4).standard_normal(backend.hidden_size).astype(np.float32)
        greedy = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0)
        feeds = backend._fused_feeds(hidden, 17, greedy, np.zeros(15, np.float32))
        logits[storage] = backend.predictor_sess.run(["logits"], feeds)[0]
    assert _snr_db(logits["fp32"], logits["fp16"]) >= 50.0


@pytest.mark.parametrize("shape", [(50, 16), (3, 20, 16), (1, 8)])
def test_blocked_quantize_rows_is_the_whole_array_formula(shape, monkeypatch):
    """quantize_rows works QUANT_ROWS rows at a time: the bits of the one-pass formula, zero rows and
    rows across block edges included."""
    from qtts.export import write

    rng = np.random.default_rng(3)
    arr = (rng.standard_normal(shape) * rng.uniform(0.001, 5.0, shape[:-1] + (1,))).astype(np.float32)
    arr.reshape(-1, shape[-1])[len(arr.reshape(-1, shape[-1])) // 2] = 0.0
    absmax = np.abs(arr).max(axis=-1)
    scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    whole = np.clip(np.rint(arr / scale[..., None]), -127, 127).astype(np.int8)
    monkeypatch.setattr(write, "QUANT_ROWS", 7)
    data, got = write.quantize_rows(arr)
    assert data.dtype == np.int8 and got.dtype == np.float32
    np.testing.assert_array_equal(got, scale)
    np.testing.assert_array_equal(data, whole)
