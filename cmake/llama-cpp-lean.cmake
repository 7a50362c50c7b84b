# Included by CMake right after llama.cpp's own `project()` call when llama-cpp-python builds it
# (the Makefile passes -DCMAKE_PROJECT_llama.cpp_INCLUDE=this file in CMAKE_ARGS; ADR 0028).
# llama-cpp-python forces LLAMA_BUILD_COMMON on, but the binding loads only libllama and the
# ggml libraries: llama.cpp's `common` library (argument parsing, chat templates, downloads)
# and the cpp-httplib it pulls in are built for nothing. Turning it off here, after the force
# and before llama.cpp reads it, skips them.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama.cpp: build common utils library" FORCE)

# No AMX (issue 45's machine, 2026-12-04): with GGML_NATIVE, -march=native on a Xeon that
# reports AMX compiles ggml's AMX matrix path, and on a virtual machine whose hypervisor does
# not pass the tile state through, its first `ldtilecfg` is a general protection fault: every
# generation of the embedded model died with SIGSEGV. The AVX-512 paths stay; GCC and Clang
# keep an explicit -mno-* flag whatever -march comes after it.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    include(CheckCCompilerFlag)
    check_c_compiler_flag("-mno-amx-tile" KEEL_CAN_REFUSE_AMX)
    if(KEEL_CAN_REFUSE_AMX)
        set(KEEL_NO_AMX "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
        set(CMAKE_C_FLAGS "${CMAKE_C_FLAGS} ${KEEL_NO_AMX}")
        set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${KEEL_NO_AMX}")
    endif()
    set(GGML_AMX_TILE OFF CACHE BOOL "ggml: AMX tiles" FORCE)
    set(GGML_AMX_INT8 OFF CACHE BOOL "ggml: AMX int8" FORCE)
    set(GGML_AMX_BF16 OFF CACHE BOOL "ggml: AMX bf16" FORCE)
endif()
