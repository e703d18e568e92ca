-- wrk script: streaming completions with a ~512-token prompt and 128 output tokens.
local words = {}
for i = 1, 512 do words[i] = "hello" end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt": "' .. table.concat(words, " ") ..
  '", "max_tokens": 128, "stream": true, "ignore_eos": true}'

done = function(summary, latency, requests)
  io.write(string.format("requests/s %.1f  latency mean %.1f ms p50 %.1f ms p99 %.1f ms  errors %d\n",
    summary.requests / (summary.duration / 1e6), latency.mean / 1e3,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end
