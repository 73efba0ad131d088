/*
 * fuzz_npy.c — libFuzzer harness for the strict .npy reader (fa_npy_parse).
 *
 * Any byte string goes in; the reader must either refuse it with a
 * status and a message that names the file, or accept it and hand back an array whose shape,
 * element count and dtype are consistent with the bytes it was given. ASan
 * and UBSan watch every read of the header parser; the harness checks the
 * contract on top:
 *
 *   - accepted => rank 0..FA_MAX_RANK, extents >= 0, numel = product of the
 *     extents, and prefix + numel * itemsize == len (no slack, no overrun);
 *   - accepted => the data is a faithful copy of the input's tail;
 *   - accepted => writing it back and parsing that again gives the same array
 *     (only for small arrays, through fa_npy_save into a temp directory);
 *   - refused  => status FORMAT/DTYPE/SHAPE/NOMEM, *arr zeroed, and
 *     fa_last_error() names the file.
 *
 * Seed corpus: tests/fuzz/corpus/npy/ (valid files of every dtype/version and
 * the malformed files of tests/corpus/bad/).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashattn.h"
#include "npy.h"

#define NAME "fuzz.npy"

static void require(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_npy: contract violated: %s (last error: %s)\n", what, fa_last_error());
        abort();
    }
}

/* Round-trip through the writer (small arrays only: the fuzzer must stay fast). */
static void check_round_trip(const fa_npy *arr)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_npy.XXXXXX");
        require(mkdtemp(dir) != NULL, "mkdtemp");
    }
    char path[96];
    snprintf(path, sizeof path, "%s/rt.npy", dir);
    fa_status st = fa_npy_save(path, arr->data, arr->dtype, arr->rank, arr->shape);
    require(st == FA_OK, "fa_npy_save of an accepted array");
    fa_npy back;
    st = fa_npy_load(path, &back);
    require(st == FA_OK, "fa_npy_load of a file fa_npy_save wrote");
    require(back.dtype == arr->dtype && back.rank == arr->rank && back.numel == arr->numel,
            "round trip keeps dtype, rank and numel");
    for (int r = 0; r < arr->rank; r++) require(back.shape[r] == arr->shape[r], "round trip keeps shape");
    size_t bytes = (size_t)arr->numel * fa_dtype_size(arr->dtype);
    require(bytes == 0 || memcmp(back.data, arr->data, bytes) == 0, "round trip keeps the bytes");
    fa_npy_free(&back);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fa_npy arr;
    memset(&arr, 0xA5, sizeof arr); /* the reader must set every field */
    fa_status st = fa_npy_parse(data, size, NAME, &arr);
    if (st != FA_OK) {
        require(st == FA_ERR_FORMAT || st == FA_ERR_DTYPE || st == FA_ERR_SHAPE || st == FA_ERR_NOMEM,
                "refusal is FA_ERR_FORMAT, _DTYPE, _SHAPE or _NOMEM");
        require(arr.data == NULL && arr.numel == 0 && arr.rank == 0, "refused array is zeroed");
        require(strstr(fa_last_error(), NAME) != NULL, "message names the file");
        fa_npy_free(&arr); /* safe on a zeroed struct */
        return 0;
    }
    require(arr.rank >= 0 && arr.rank <= FA_MAX_RANK, "rank in 0..FA_MAX_RANK");
    size_t item = fa_dtype_size(arr.dtype);
    require(item != 0, "dtype is valid");
    int64_t n = 1;
    int empty = 0; /* any zero extent: empty, whatever the others (their product may overflow) */
    for (int r = 0; r < arr.rank; r++) {
        require(arr.shape[r] >= 0, "extents are non-negative");
        if (arr.shape[r] == 0) empty = 1;
    }
    for (int r = 0; r < arr.rank && !empty; r++) n *= arr.shape[r];
    if (empty) n = 0;
    require(n == arr.numel, "numel is the product of the extents");
    size_t bytes = (size_t)n * item;
    require(bytes <= size, "data fits in the input");
    require(bytes == 0 || memcmp(arr.data, data + (size - bytes), bytes) == 0,
            "data is the input's tail, byte for byte");
    int64_t bad = fa_npy_find_nonfinite(&arr);
    require(bad >= -1 && bad < n, "first non-finite index is in range");
    if (arr.rank >= 1) {
        fa_tensor t;
        require(fa_npy_as_tensor(&arr, &t) == FA_OK, "accepted array has a tensor view");
        require(fa_tensor_numel(&t) == n, "tensor view has the same numel");
    }
    if (bytes <= 4096) check_round_trip(&arr);
    fa_npy_free(&arr);
    return 0;
}
