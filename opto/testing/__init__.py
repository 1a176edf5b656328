"""Offline fakes for code that talks to OpenAI-compatible APIs, NVIDIA NeMo Customizer and
OpenPipe ART's training servers, and a fake cluster for distributed executors."""

from opto.testing.fake_art import FakeARTServer
from opto.testing.fake_cluster import FakeCluster
from opto.testing.fake_nemo import FakeNeMoCustomizer, FakeNeMoJob
from opto.testing.fake_openai import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest, StoredFile

__all__ = [
    "FakeARTServer",
    "FakeCluster",
    "FakeNeMoCustomizer",
    "FakeNeMoJob",
    "FakeOpenAIServer",
    "FakeReply",
    "LognormalLatency",
    "RecordedRequest",
    "StoredFile",
]
