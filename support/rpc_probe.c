/* relaxc's probe of an RPC device: uploaded to each server of a tracker key and loaded there as a
 * TVM module (support/remote.py). Its one function copies what the server's own files say about the
 * machine and the server (/proc/cpuinfo: CPU features and cores; /proc/self/maps: where its TVM and
 * tvm-ffi libraries were loaded from, next to their versions; /proc/self/environ: its thread settings)
 * into regular files of the session's folder, which the client then downloads: TVM's download cannot
 * read /proc files (they report size 0). */
#include <stdio.h>
#include <string.h>

#include <tvm/ffi/c_api.h>

static int copy_file(const char* from, const char* to) {
  FILE* in = fopen(from, "rb");
  if (in == NULL) return 0;
  FILE* out = fopen(to, "wb");
  if (out == NULL) {
    fclose(in);
    return 0;
  }
  char buffer[8192];
  size_t n;
  int ok = 1;
  while (ok && (n = fread(buffer, 1, sizeof buffer, in)) > 0) ok = fwrite(buffer, 1, n, out) == n;
  ok = !ferror(in) && ok;
  fclose(in);
  return fclose(out) == 0 && ok;
}

/* relaxc_probe(): 1 where every file was copied; what it writes lies in the session's working folder
 * (the Python server's sessions run there), as relaxc_cpuinfo.txt, relaxc_maps.txt, relaxc_environ.txt. */
__attribute__((visibility("default"))) int __tvm_ffi_relaxc_probe(void* self, const TVMFFIAny* args,
                                                                   int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)num_args;
  int copied = copy_file("/proc/cpuinfo", "relaxc_cpuinfo.txt") && copy_file("/proc/self/maps", "relaxc_maps.txt") &&
               copy_file("/proc/self/environ", "relaxc_environ.txt");
  memset(result, 0, sizeof *result);
  result->type_index = kTVMFFIInt;
  result->v_int64 = copied;
  return 0;
}
