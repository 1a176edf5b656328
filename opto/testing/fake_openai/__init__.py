"""An in-process fake of the OpenAI HTTP API, for offline tests.

`FakeOpenAIServer` is a real HTTP server on 127.0.0.1 (standard library only) that
speaks the parts of the OpenAI API this project uses: chat completions, file
uploads and fine-tuning jobs. Point any OpenAI client at `server.base_url`::

    with FakeOpenAIServer(reply="hello") as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        ...
        assert server.chat_requests[0]["model"] == "gpt-4o-mini"

Faults (rate limits, server errors, hangs, broken bodies) can be queued for the
next chat completion requests, so retry and timeout handling can be tested
without a network.
"""

from .chat import FakeReply
from .fine_tuning import StoredFile
from .http import RecordedRequest
from .latency import LognormalLatency
from .server import FakeOpenAIServer

__all__ = ["FakeOpenAIServer", "FakeReply", "LognormalLatency", "RecordedRequest", "StoredFile"]
