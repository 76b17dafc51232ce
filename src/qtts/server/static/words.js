// qtts web page, word timestamps: the SSE reader of POST /v1/audio/speech (stream_format "sse",
// timestamps: true) and the view that highlights the word being played. Loaded before app.js.
"use strict";

// stream_format "sse": "data: {json}" blocks; audio deltas are base64 PCM, speech.words carry words.
async function receiveEvents(reader, sink, view) {
  const text = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += text.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!block.startsWith("data: ")) continue;
      const event = JSON.parse(block.slice(6));
      if (event.type === "speech.audio.delta") sink.push(Uint8Array.from(atob(event.audio), (c) => c.charCodeAt(0)));
      else if (event.type === "speech.words") view.add(event.words);
      else if (event.type === "error") throw new Error(event.error.message);
    }
  }
}

// The words of the audio as spans; the word being played is highlighted: the last one that has
// started by the player's position (it stays lit through the pause after it, until the next word
// starts; times are seconds from the start of the stream's audio). A piece's words come once its
// audio is out and aligned, so the start of a piece can play before its words are known: the
// last known word stays lit until they come. Changes go to last.highlights.
class WordView {
  constructor(el, last) {
    this.el = el;
    this.last = last;
    this.spans = [];
    this.current = -1;
    el.replaceChildren();
  }

  add(words) {
    for (const w of words) {
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = w.text;
      span.dataset.i = String(this.spans.length);
      span.title = `${w.start.toFixed(2)}–${w.end.toFixed(2)} s (${w.unit})`;
      if (this.spans.length) this.el.append(" ");
      this.el.append(span);
      this.spans.push(span);
      this.last.words.push(w);
    }
  }

  at(t) {
    const words = this.last.words; // (in order: their starts never decrease)
    let found = -1;
    for (let i = 0; i < words.length && words[i].start <= t; i++) found = i;
    return found;
  }

  show(t) {
    const i = t < 0 ? -1 : this.at(t);
    this.last.known = this.last.words.length; // the words this highlight was chosen from
    if (i === this.current) return;
    if (this.current >= 0) this.spans[this.current].classList.remove("now");
    if (i >= 0) this.spans[i].classList.add("now");
    this.current = i;
    this.last.highlights.push({ index: i, t, known: this.last.words.length });
  }

  // Follow the player's clock every animation frame until the audio has played (or was stopped).
  follow(player) {
    const tick = () => {
      const t = player.position();
      this.show(t);
      const over = (this.last.done && t >= player.queued - 1e-3) || this.last.error;
      if (over) this.show(-1);
      else requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  }
}

function stopPlaying(why) {
  current.abort.abort();
  current.player.stop();
  setStatus($("status"), why);
}
