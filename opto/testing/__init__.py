"""Offline fakes for code that talks to OpenAI-compatible APIs and to NVIDIA NeMo Customizer."""

from opto.testing.fake_nemo import FakeNeMoCustomizer, FakeNeMoJob
from opto.testing.fake_openai import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest, StoredFile

__all__ = ["FakeNeMoCustomizer", "FakeNeMoJob", "FakeOpenAIServer", "FakeReply", "LognormalLatency",
           "RecordedRequest", "StoredFile"]
