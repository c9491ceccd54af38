"""One completion through the official OpenAI Python SDK (pinned in
.ci/requirements-openai.txt), with its default client: `max_retries` left
at the SDK's default (2), which waits `retry-after-ms` when the server sends
it. Run by server/tests/openai_sdk.rs against a frontend whose only worker
is busy for about 2 s.

Usage: openai_sdk.py BASE_URL MODEL

Prints `ready` (the SDK imported and the client built) and then, on success,
one JSON line: the SDK's version, the client's max_retries, the seconds the
call took and the completion's text. Any error the SDK raises (say a 529
after its retries) exits non-zero with the traceback.
"""

import json
import sys
import time

import openai


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x")
    print("ready", flush=True)
    start = time.monotonic()
    completion = client.completions.create(model=model, prompt="hello world", max_tokens=2)
    took = time.monotonic() - start
    print(
        json.dumps(
            {
                "version": openai.__version__,
                "max_retries": client.max_retries,
                "seconds": took,
                "text": completion.choices[0].text,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
