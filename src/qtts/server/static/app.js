// qtts web page: POST /v1/audio/speech (response_format "pcm") read as a stream and played
// through WebAudio while it arrives. With "word timestamps" the same request asks for SSE
// (stream_format "sse", timestamps: true): base64 audio events and speech.words events, and the
// word being played is highlighted from the player's clock. Plain JavaScript, no build step,
// same-origin requests only.
"use strict";

const $ = (id) => document.getElementById(id);
const RATE = 24000; // s16le mono at 24 kHz (the pcm response format)

// What the last synthesis did; the browser test reads it.
window.qtts = { info: null, last: null };

function setStatus(el, text, kind) {
  el.textContent = text || "";
  el.className = "status" + (kind ? " " + kind : "");
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return `HTTP ${resp.status}`;
}

// -- the served model and its voices ------------------------------------------------------------
async function loadInfo() {
  let resp;
  try {
    resp = await fetch("ui/info");
  } catch (e) {
    setStatus($("status"), "cannot reach the server; retrying…", "error");
    setTimeout(loadInfo, 2000);
    return;
  }
  if (resp.status === 503) {
    $("model").textContent = "the model is loading…";
    setTimeout(loadInfo, 1000);
    return;
  }
  if (!resp.ok) {
    setStatus($("status"), await errorText(resp), "error");
    return;
  }
  const info = await resp.json();
  window.qtts.info = info;
  const size = /^\d+b\d+$/.test(info.model_size) ? info.model_size.replace("b", ".") + "B" : info.model_size;
  const kind = { base: "Base", custom_voice: "CustomVoice", voice_design: "VoiceDesign" }[info.model_type];
  $("model").textContent = `model: ${info.model} · Qwen3-TTS ${size} ${kind || info.model_type}`;
  $("text").maxLength = info.max_input_chars;
  fillLanguages(info.languages);
  $("instruct-field").hidden = !info.instruct;
  $("instruct-note").textContent = info.instruct_required ? "(required)" : "(optional)";
  $("voice-field").hidden = info.model_type === "voice_design";
  $("upload-card").hidden = !(info.cloning && info.uploads);
  $("timestamps-note").textContent = info.timestamps === "word" ? "(per word)"
    : "(per sentence: the server has no forced aligner)";
  await loadVoices();
  $("play").disabled = false;
}

function fillLanguages(languages) {
  const select = $("language");
  select.replaceChildren();
  for (const lang of languages) select.append(new Option(lang, lang, lang === "auto", lang === "auto"));
}

async function loadVoices(selectId) {
  const resp = await fetch("v1/voices");
  if (!resp.ok) {
    setStatus($("status"), await errorText(resp), "error");
    return;
  }
  const data = (await resp.json()).data;
  const select = $("voice");
  const keep = selectId || select.value;
  select.replaceChildren();
  const groups = [["speaker", "Speakers"], ["voice", "Saved voices"]];
  for (const [type, label] of groups) {
    const items = data.filter((v) => v.type === type);
    if (!items.length) continue;
    const group = document.createElement("optgroup");
    group.label = label;
    for (const v of items) group.append(new Option(v.id, v.id));
    select.append(group);
  }
  const info = window.qtts.info;
  if (!select.options.length && info.cloning) {
    const hint = info.uploads ? "upload a clip below" : "start qtts serve with --voices DIR";
    select.append(new Option(`(no saved voice yet: ${hint})`, ""));
  }
  if (keep && [...select.options].some((o) => o.value === keep)) select.value = keep;
}

// -- playback -----------------------------------------------------------------------------------
class PcmPlayer {
  // Schedules float chunks back to back; if generation falls behind, the lead grows.
  constructor(ctx) {
    this.ctx = ctx;
    this.next = 0;
    this.lead = 0.08;
    this.sources = new Set();
    this.played = 0; // seconds of audio whose buffer finished playing
    this.queued = 0; // seconds of audio handed to push()
    this.segments = []; // { at: context time it starts, from: stream seconds, dur }
  }

  // Seconds of the stream's audio played by now (-1 before the first buffer starts); a gap
  // (an underrun) holds the position at the end of the buffer before it.
  position() {
    const now = this.ctx.currentTime;
    let pos = -1;
    for (const s of this.segments) {
      if (s.at > now) break;
      pos = s.from + Math.min(now - s.at, s.dur);
    }
    return pos;
  }

  push(samples) {
    const buffer = this.ctx.createBuffer(1, samples.length, RATE);
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const now = this.ctx.currentTime;
    if (this.next && this.next < now) this.lead = Math.min(2, this.lead + 0.25); // an underrun
    const start = Math.max(this.next, now + this.lead);
    source.onended = () => {
      this.sources.delete(source);
      this.played += buffer.duration;
    };
    source.start(start);
    this.sources.add(source);
    this.next = start + buffer.duration;
    this.segments.push({ at: start, from: this.queued, dur: buffer.duration });
    this.queued += buffer.duration;
  }

  stop() {
    for (const s of this.sources) s.stop();
    this.sources.clear();
  }
}

class PcmDecoder {
  // s16le bytes (split anywhere by the network) -> float32 samples
  constructor() {
    this.carry = null;
  }

  push(bytes) {
    if (this.carry) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.carry;
      joined.set(bytes, 1);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const out = new Float32Array(bytes.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  }
}

function wavBlob(parts, samples) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + samples * 2, true);
  text(8, "WAVEfmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, 1, true);
  header.setUint32(24, RATE, true);
  header.setUint32(28, RATE * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, samples * 2, true);
  return new Blob([header, ...parts], { type: "audio/wav" });
}

let current = null; // { abort, player }

function request() {
  const body = { model: "qtts", input: $("text").value, response_format: "pcm" };
  const info = window.qtts.info;
  if (info.model_type !== "voice_design" && $("voice").value) body.voice = $("voice").value;
  if ($("language").value !== "auto") body.language = $("language").value;
  const instruct = $("instruct").value.trim();
  if (info.instruct && instruct) body.instructions = instruct;
  const speed = Number($("speed").value);
  if (speed !== 1) body.speed = speed;
  if ($("timestamps").checked) Object.assign(body, { stream_format: "sse", timestamps: true });
  return body;
}

function showStats(last) {
  $("ttfa").textContent = last.ttfa_ms === null ? "–" : `${Math.round(last.ttfa_ms)} ms`;
  const audio = last.samples / RATE;
  $("audio-s").textContent = `${audio.toFixed(2)} s`;
  $("rtf").textContent = audio > 0 ? (last.elapsed_ms / 1000 / audio).toFixed(2) : "–";
  $("bytes").textContent = `${(last.bytes / 1024).toFixed(1)} KiB`;
}

async function play() {
  if (current) {
    stopPlaying("stopped");
    return;
  }
  const ctx = window.qtts.ctx || (window.qtts.ctx = new AudioContext());
  await ctx.resume();
  const player = new PcmPlayer(ctx);
  const abort = new AbortController();
  current = { abort, player };
  const last = { bytes: 0, samples: 0, ttfa_ms: null, elapsed_ms: 0, done: false, error: null, player,
    words: [], highlights: [], known: 0 };
  window.qtts.last = last;
  const body = request();
  const view = new WordView($("words"), last);
  $("words").hidden = !body.timestamps;
  $("play").textContent = "■ Stop";
  $("download").hidden = true;
  setStatus($("status"), "generating…");
  const t0 = performance.now();
  try {
    const resp = await fetch("v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: abort.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    const sink = audioSink(player, last, t0);
    if (body.timestamps) {
      view.follow(player);
      await receiveEvents(resp.body.getReader(), sink, view);
    } else {
      await receive(resp.body.getReader(), sink);
    }
    finish(sink, last, t0);
    last.done = true;
    setStatus($("status"), `done: ${(last.samples / RATE).toFixed(2)} s of audio`, "ok");
  } catch (e) {
    last.error = e.name === "AbortError" ? "stopped" : e.message;
    if (e.name !== "AbortError") setStatus($("status"), last.error, "error");
  } finally {
    current = null;
    $("play").textContent = "▶ Play";
  }
}

// Where PCM bytes go: the player, the stats and the download's parts.
function audioSink(player, last, t0) {
  const decoder = new PcmDecoder();
  const parts = [];
  return {
    parts,
    push(bytes) {
      parts.push(bytes);
      last.bytes += bytes.length;
      const samples = decoder.push(bytes);
      if (!samples.length) return;
      if (last.ttfa_ms === null) last.ttfa_ms = performance.now() - t0;
      last.samples += samples.length;
      player.push(samples);
      last.elapsed_ms = performance.now() - t0;
      showStats(last);
    },
  };
}

async function receive(reader, sink) {
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    sink.push(value);
  }
}

function finish(sink, last, t0) {
  last.elapsed_ms = performance.now() - t0;
  showStats(last);
  const link = $("download");
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(wavBlob(sink.parts, Math.floor(last.bytes / 2)));
  link.hidden = false;
}

// -- uploads ------------------------------------------------------------------------------------
async function upload(event) {
  event.preventDefault();
  const form = $("upload");
  const data = new FormData(form);
  for (const key of ["name", "ref_text"]) if (!String(data.get(key) || "").trim()) data.delete(key);
  $("upload-button").disabled = true;
  setStatus($("upload-status"), "making the voice…");
  try {
    const resp = await fetch("v1/voices", { method: "POST", body: data });
    if (!resp.ok) throw new Error(await errorText(resp));
    const voice = await resp.json();
    await loadVoices(voice.id);
    form.reset();
    setStatus($("upload-status"), `saved as "${voice.id}" and selected`, "ok");
  } catch (e) {
    setStatus($("upload-status"), e.message, "error");
  } finally {
    $("upload-button").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("play").addEventListener("click", play);
  $("upload").addEventListener("submit", upload);
  $("speed").addEventListener("input", () => {
    $("speed-value").textContent = `${Number($("speed").value).toFixed(2)}×`;
  });
  loadInfo();
});
