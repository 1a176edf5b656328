"""`python -m llama_cpp.server`, with llama.cpp's extra buffer types off as `LocalModel` has
them (their AMX path crashes on VMs whose CPU reports AMX the kernel does not enable),
and, unless the arguments say otherwise, as many threads as `LocalModel` takes: the cores
this process may run on (the server's own default batches prompts on every core of the
machine, ten times slower on a test worker that has one). Arguments are the server's own."""

import runpy
import sys

import llama_cpp.llama

from opto.llm.local import _model_defaults, usable_cpus

if __name__ == "__main__":
    for flag in ("--n_threads", "--n_threads_batch"):
        if flag not in sys.argv:
            sys.argv += [flag, str(usable_cpus())]
    with _model_defaults(llama_cpp.llama, extra_buffer_types=False):
        sys.argv[0] = "llama_cpp.server"
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
