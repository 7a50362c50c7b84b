# Included by CMake right after llama.cpp's own `project()` call when llama-cpp-python builds it
# (the Makefile passes -DCMAKE_PROJECT_llama.cpp_INCLUDE=this file in CMAKE_ARGS; ADR 0028).
# llama-cpp-python forces LLAMA_BUILD_COMMON on, but the binding loads only libllama and the
# ggml libraries: llama.cpp's `common` library (argument parsing, chat templates, downloads)
# and the cpp-httplib it pulls in are built for nothing. Turning it off here, after the force
# and before llama.cpp reads it, skips them.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp: build common utils library" FORCE)
