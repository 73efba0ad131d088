/*
 * fuzz_npy.c — libFuzzer harness for the CLI's strict .npy reader (fa_npy_parse,
 * src/cli/npy.c: linked from the CLI's object, it is not part of the library).
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
 *     (only for small arrays, through fa_npy_save_type into a temp directory);
 *   - accepted integer array ('<i4', '|u1') => no tensor view (FA_ERR_DTYPE);
 *   - refused  => status FORMAT/DTYPE/SHAPE/NOMEM, *arr zeroed, and
 *     fa_npy_last_error() names the file.
 *
 * Seed corpus: tests/fuzz/corpus/npy/ (valid files of every type/version and
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
        fprintf(stderr, "fuzz_npy: contract violated: %s (last error: %s)\n", what, fa_npy_last_error());
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
    fa_status st = fa_npy_save_type(path, arr->data, arr->type, arr->rank, arr->shape);
    require(st == FA_OK, "fa_npy_save_type of an accepted array");
    fa_npy back;
    st = fa_npy_load(path, &back);
    require(st == FA_OK, "fa_npy_load of a file fa_npy_save wrote");
    require(back.type == arr->type && back.dtype == arr->dtype && back.rank == arr->rank &&
                back.numel == arr->numel, "round trip keeps type, dtype, rank and numel");
    for (int r = 0; r < arr->rank; r++) require(back.shape[r] == arr->shape[r], "round trip keeps shape");
    size_t bytes = (size_t)arr->numel * fa_npy_type_size(arr->type);
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
        require(strstr(fa_npy_last_error(), NAME) != NULL, "message names the file");
        fa_npy_free(&arr); /* safe on a zeroed struct */
        return 0;
    }
    require(arr.rank >= 0 && arr.rank <= FA_MAX_RANK, "rank in 0..FA_MAX_RANK");
    size_t item = fa_npy_type_size(arr.type);
    require(item != 0, "type is valid");
    int is_int = arr.type == FA_NPY_I32 || arr.type == FA_NPY_U8;
    require(is_int ? arr.dtype == FA_DTYPE_COUNT : fa_dtype_size(arr.dtype) == item,
            "dtype is the float type's, or none for an integer array");
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
    require(!is_int || bad == -1, "integers are finite");
    if (is_int) {
        fa_tensor t;
        require(fa_npy_as_tensor(&arr, &t) == FA_ERR_DTYPE, "an integer array has no tensor view");
        require(strstr(fa_npy_last_error(), "index or code files") != NULL, "the refusal says why");
    } else if (arr.rank >= 1) {
        fa_tensor t;
        require(fa_npy_as_tensor(&arr, &t) == FA_OK, "accepted array has a tensor view");
        require(fa_tensor_numel(&t) == n, "tensor view has the same numel");
    }
    if (bytes <= 4096) check_round_trip(&arr);
    fa_npy_free(&arr);
    return 0;
}
