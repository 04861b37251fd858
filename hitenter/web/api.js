// Talking to the playground API (hitenter/server/playground.py). Every stream is Server-Sent Events:
// lines "data: {json}" separated by a blank line. POST streams are read with fetch().
const BASE = "/playground/api";

export async function getJSON(path) {
  const r = await fetch(BASE + path);
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

export async function postJSON(path, body) {
  const r = await fetch(BASE + path, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

// POST `body` to `path` and call onEvent(obj) for every SSE event until the stream ends.
// Aborting `signal` closes the connection; the server then aborts the request in the engine.
export async function streamPost(path, body, onEvent, signal) {
  const r = await fetch(BASE + path, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal,
  });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const chunk = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of chunk.split("\n")) {
        if (line.startsWith("data: ")) onEvent(JSON.parse(line.slice(6)));
      }
    }
  }
}

// The engine-wide step stream of one model (batches, preemptions, the KV block map).
export function engineEvents(model, onEvent) {
  const es = new EventSource(`${BASE}/events?model=${encodeURIComponent(model)}`);
  es.onmessage = (m) => onEvent(JSON.parse(m.data));
  return es;
}
