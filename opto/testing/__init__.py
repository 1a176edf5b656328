"""Test helpers for code that talks to OpenAI-compatible APIs."""

from opto.testing.fake_openai import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest, StoredFile

__all__ = ["FakeOpenAIServer", "FakeReply", "LognormalLatency", "RecordedRequest", "StoredFile"]
