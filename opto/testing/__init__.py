"""Offline fakes for code that talks to OpenAI-compatible APIs, NVIDIA NeMo Customizer and
OpenPipe ART's training servers, and a fake cluster for distributed executors."""

from .fake_art import FakeARTServer
from .fake_cluster import FakeCluster
from .fake_nemo import FakeNeMoCustomizer, FakeNeMoJob
from .fake_openai import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest, StoredFile

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
