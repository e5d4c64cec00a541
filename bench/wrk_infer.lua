-- wrk script for the inferd side-by-side benchmark: POSTs one fixed KServe v2 infer request.
--   BENCH_BODY          file holding the request body (JSON, or JSON header + raw tensor bytes)
--   BENCH_HEADER_LEN    if set: binary-tensor request, sent as Inference-Header-Content-Length
-- done() prints one JSON line; status_errors counts every non-2xx/3xx response (wrk excludes nothing
-- from `requests`, so throughput is reported as (requests - errors) by the harness).
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
local hlen = os.getenv("BENCH_HEADER_LEN")
if hlen and hlen ~= "" then
  wrk.headers["Content-Type"] = "application/octet-stream"
  wrk.headers["Inference-Header-Content-Length"] = hlen
else
  wrk.headers["Content-Type"] = "application/json"
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"status_errors":%d,"connect_errors":%d,'
    .. '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,'
    .. '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
