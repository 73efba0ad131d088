/*
 * fuzz_cli_args.c — libFuzzer harness for the CLI's option parsing.
 *
 * The input is an argument vector: NUL-separated strings. The first byte picks
 * the subcommand (run, check, info, grad or check-grad; bench and demo are
 * left out because a valid vector would start a long computation), the rest
 * become argv[1..].
 * The subcommand's entry point (cmd_run, ...) is called in-process exactly as
 * main() calls it: every option parser, every number parser, the help text,
 * the "missing option" and "unknown option" paths, and the input loaders,
 * which here meet only files that do not exist (the harness runs in an empty
 * temporary directory, so no path the fuzzer invents can name a real input
 * and nothing is ever written).
 *
 * What must hold: no sanitizer report, no leak, and the exit status is one of
 * the documented ones (0 help/ok, 2 bad usage; 1 only from check and check-grad).
 * Run with -close_fd_mask=3: the subcommands print a line per input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_ARGS 64

/*
 * Move into an empty temporary directory before fuzzing. libFuzzer reads its
 * corpus directories and writes artifacts later, relative to where it was
 * started, so first turn every relative path on its command line (corpus
 * directories, files to replay, -artifact_prefix=) into an absolute one.
 */
static char *absolute(const char *cwd, const char *prefix, const char *path)
{
    size_t n = strlen(cwd) + strlen(prefix) + strlen(path) + 3;
    char *out = malloc(n); /* lives as long as the process, like argv */
    snprintf(out, n, "%s%s/%s", prefix, cwd, path);
    return out;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) abort();
    for (int i = 1; i < *argc; i++) {
        char *a = (*argv)[i];
        static const char *const path_flags[] = {"-artifact_prefix=", "-exact_artifact_path="};
        for (int f = 0; f < 2; f++) {
            size_t n = strlen(path_flags[f]);
            if (strncmp(a, path_flags[f], n) == 0 && a[n] != '/') {
                char *flag = strndup(a, n);
                (*argv)[i] = absolute(cwd, flag, a + n);
                free(flag);
            }
        }
        if (a[0] != '-' && a[0] != '/') (*argv)[i] = absolute(cwd, "", a);
    }
    char dir[] = "/tmp/fuzz_cli_args.XXXXXX";
    if (!mkdtemp(dir) || chdir(dir) != 0) {
        perror("fuzz_cli_args: temporary directory");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const char *const names[5] = {"run", "check", "info", "grad", "check-grad"};
    const int which = data[0] % 5;
    /* Copy into one NUL-terminated buffer so every piece is a C string. */
    char *buf = malloc(size + 1);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = (char *)names[which];
    for (size_t i = 0; i < size - 1 && argc <= MAX_ARGS;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;

    int rc;
    switch (which) {
    case 0: rc = cmd_run(argc, argv); break;
    case 1: rc = cmd_check(argc, argv); break;
    case 2: rc = cmd_info(argc, argv); break;
    case 3: rc = cmd_grad(argc, argv); break;
    default: rc = cmd_check_grad(argc, argv); break;
    }
    const int is_check = which == 1 || which == 4;
    if (rc != 0 && rc != 2 && !(is_check && rc == 1)) {
        fprintf(stderr, "fuzz_cli_args: %s returned exit status %d\n", names[which], rc);
        abort();
    }
    fflush(stdout);
    free(buf);
    return 0;
}
