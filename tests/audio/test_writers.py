"""The one family of audio writers (qtts.audio.writers): the WAV header bytes, the server and the CLI
writing the same bytes for the same chunks, what streams per chunk, atomic files."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import soundfile as sf

from qtts.audio.chunk import Audio, AudioChunk
from qtts.audio.writers import AUDIO_FORMATS, AudioWriter, open_stream, wav_header, wav_header_streaming

#: 44 bytes: RIFF, sizes, fmt (PCM, mono, 24 kHz, 48000 B/s, align 2, 16 bit), data
HEADER_24K = bytes.fromhex("52494646" "24000000" "57415645" "666d7420" "10000000" "0100" "0100" "c05d0000"
                           "80bb0000" "0200" "1000" "64617461" "00000000")  # fmt: skip


def _chunks() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in (1920, 3840, 5000, 17)]
    return out + [np.array([1.5, -1.7, 0.99, 2.0] * 50, dtype=np.float32)]  # clipped the same everywhere


def _served(fmt: str, chunks: list[np.ndarray]) -> list[bytes]:
    """The bytes the server sends for ``chunks``, per call, as server/routes/speech.py drives its writer."""
    from qtts.server.formats import open_format

    writer = open_format(fmt)
    return [writer.start(), *(writer.write(c) for c in chunks), writer.finish()]


def _said(path: str, fmt: str, chunks: list[np.ndarray]) -> bytes:
    """The file ``qtts say -o path`` writes for ``chunks`` (its own write loop)."""
    from qtts.cli.common import Progress
    from qtts.cli.say import write_chunks

    stream = (AudioChunk(c, frame_start=i, num_frames=1, is_final=i == len(chunks) - 1,
                         info={"frames": i + 1, "wall_s": 0.0}) for i, c in enumerate(chunks))
    write_chunks(stream, path, fmt, Progress(quiet=True))
    with open(path, "rb") as fh:
        return fh.read()


def test_wav_headers_are_pinned():
    assert wav_header(24000, 0) == HEADER_24K
    assert wav_header(24000, 100)[4:8] == (136).to_bytes(4, "little") and wav_header(24000, 100)[40:] == b"d\0\0\0"
    streaming = wav_header_streaming(24000)
    assert streaming[4:8] == b"\xff" * 4 and streaming[40:44] == (0xFFFFFFFF - 36).to_bytes(4, "little")
    assert streaming[8:40] == HEADER_24K[8:40]


def test_server_and_cli_write_the_same_wav(tmp_path):
    chunks = _chunks()
    served = b"".join(_served("wav", chunks))
    said = _said(str(tmp_path / "x.wav"), "wav", chunks)
    n = 2 * sum(len(c) for c in chunks)
    assert len(said) == len(served) == 44 + n
    assert said[44:] == served[44:]  # the samples, byte for byte
    assert said[:44] == wav_header(24000, n) and served[:44] == wav_header_streaming(24000)
    decoded, sr = sf.read(io.BytesIO(said), dtype="int16")
    assert sr == 24000 and decoded.max() == 32767 and decoded.min() == -32767  # the overs clipped


@pytest.mark.parametrize("fmt", ["pcm", "flac"])
def test_server_and_cli_write_the_same_bytes(tmp_path, fmt):
    chunks = _chunks()
    assert _said(str(tmp_path / f"x.{fmt}"), fmt, chunks) == b"".join(_served(fmt, chunks))


@pytest.mark.parametrize("fmt", ["wav", "pcm", "mp3", "opus"])
def test_streamed_formats_send_bytes_before_the_end(fmt):
    parts = _served(fmt, [np.zeros(24000, np.float32)] * 3)
    assert sum(map(len, parts[:-1])) > 0


def test_flac_arrives_whole_at_the_end():
    parts = _served("flac", _chunks())
    assert not any(parts[:-1]) and parts[-1][:4] == b"fLaC"
    assert sf.info(io.BytesIO(parts[-1])).frames == sum(len(c) for c in _chunks())


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_a_failed_write_leaves_no_file(tmp_path, fmt):
    path = tmp_path / f"out.{fmt}"
    with pytest.raises(RuntimeError, match="boom"), AudioWriter(str(path)) as w:
        w.write(np.zeros(4800, np.float32))
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_audio_save_is_the_file_writer(tmp_path):
    samples = np.concatenate(_chunks())
    Audio(samples).save(str(tmp_path / "a.wav"))
    with AudioWriter(str(tmp_path / "b.wav")) as w:
        w.write(samples)
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_unknown_stream_format_is_refused():
    from qtts.errors import InputError

    with pytest.raises(InputError, match="unknown audio format 'ogg'"):
        open_stream("ogg")
