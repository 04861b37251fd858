// A run: one prompt's request(s) as the page saw them. `consume` folds each /generate event into it.

export function newRun(models, name, mode, p, text) {
  const m = models.find((x) => x.name === name);
  return { model: name, mode, params: p, promptText: text, rid: null, prompt_ids: null, pieces: [], tokens: [], steps: [],
    text: "", textBase: "", heldBack: "", finish: null, stopReason: null, endToken: null, stopSpan: null, ttft: null, itl: [],
    cached: null, error: null, blockSize: m.block_size, bytesPerToken: m.kv_bytes_per_token, templateUsed: false,
    layerTypes: m.layer_types || [], stateBytes: m.state_bytes_per_sequence || 0,
    maxModelLen: m.max_model_len, bodies: [] };
}

// Fold one event of a /generate stream into a run.
export function consume(run, ev) {
  if (ev.type === "start") {
    run.rid = ev.request_id;
    if (!run.prompt_ids) Object.assign(run, { prompt_ids: ev.prompt_ids, pieces: ev.pieces, templateUsed: ev.template_used });
    // a Step request is the whole Enter request again with max_tokens = n: its tokens replace the run's
    if (run.mode === "step") Object.assign(run, { steps: [], tokens: [], text: "", stopSpan: null });
    run.textBase = run.text;
    run.base = run.tokens.length;
  } else if (ev.type === "step") {
    run.steps.push(ev);
    if (ev.token) run.tokens.push({ piece: ev.token, rid: run.rid, index: ev.index, trace: ev.trace, entropy: ev.entropy,
      lookup: ev.lookup, lookupPieces: ev.lookup_pieces });
    (ev.more || []).forEach((p, j) => run.tokens.push({ piece: p, rid: run.rid, index: ev.index + j + 1, trace: null,
      speculated: true }));     // the same step's further tokens (speculative decoding): no trace of their own
  } else if (ev.type === "output") {
    run.text = run.textBase + ev.text;
    run.heldBack = ev.held_back;
    // a thinking model: the reply's two stages, as the model's reasoning parser reads them (absent otherwise)
    Object.assign(run, { thinking: ev.thinking, answer: ev.answer });
    Object.assign(run, { ttft: ev.ttft, beforeEngine: ev.before_engine ?? null, itl: ev.itl, cached: ev.num_cached_tokens });
    if (ev.disaggregated) run.disagg = ev.disaggregated;
    if (ev.tensor_parallel) run.tp = ev.tensor_parallel;       // the processes' collectives while it ran      // the prefill worker's own timings and the KV it shipped
    if (ev.finished) {
      const budgetLeft = run.params.max_tokens - run.tokens.length;
      if (run.mode !== "step" || ev.finish_reason === "stop" || budgetLeft <= 0) {
        run.finish = ev.finish_reason;
        run.stopReason = ev.stop_reason;
        run.endToken = ev.end_token || null;     // an end-of-generation token (stop_reason is null then)
      }
      if (ev.stop_span) run.stopSpan = ev.stop_span.map((i) => i + run.base);
    }
  } else if (ev.type === "error") {
    run.error = ev;
  }
}
