"""`python -m llama_cpp.server`, with llama.cpp's extra buffer types off as `LocalModel` has
them (their AMX path crashes on VMs whose CPU reports AMX the kernel does not enable).
Arguments are the server's own."""

import runpy
import sys

import llama_cpp.llama

from opto.llm.local import _model_defaults

if __name__ == "__main__":
    with _model_defaults(llama_cpp.llama, extra_buffer_types=False):
        sys.argv[0] = "llama_cpp.server"
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
