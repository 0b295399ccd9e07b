-- wrk script for benchmarks/middleware_wire.py: POST /run with a small JSON body.
wrk.method = "POST"
wrk.body = '{"episode_id": "e1"}'
wrk.headers["Content-Type"] = "application/json"
