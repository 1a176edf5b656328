"""Offline fakes for code that talks to OpenAI-compatible APIs, NVIDIA NeMo Customizer and
OpenPipe ART's training servers."""

from opto.testing.fake_art import FakeARTServer
from opto.testing.fake_nemo import FakeNeMoCustomizer, FakeNeMoJob
from opto.testing.fake_openai import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest, StoredFile

__all__ = ["FakeARTServer", "FakeNeMoCustomizer", "FakeNeMoJob", "FakeOpenAIServer", "FakeReply", "LognormalLatency",
           "RecordedRequest", "StoredFile"]
