/*
 * main.c — the `flashattn` command: pick a subcommand from a table and run it.
 *
 * Each subcommand lives in cmd_<name>.c, parses its own options, and returns
 * an exit status (cli.h): 0 ok, 1 check mismatch, 2 bad usage or bad input.
 * Adding a subcommand is one line in `commands` below plus its file.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "attention on .npy files: Q, K, V -> O (and LSE)"},
    {"check", cmd_check, "validate a tested attention output against the float64 reference"},
    {"grad", cmd_grad, "attention backward pass on .npy files: dO -> dQ, dK, dV"},
    {"probe", cmd_probe, "write input sets that make check --diagnose's classes distinguishable"},
    {"check-grad", cmd_check_grad, "validate tested gradients against the float64 reference backward"},
    {"bench", cmd_bench, "measure time, GFLOP/s and memory of the implementations"},
    {"demo", cmd_demo, "standard vs flash side by side on a built-in problem (make run)"},
    {"info", cmd_info, "ISA, cache sizes, block sizes and threads on this machine"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *out)
{
    fprintf(out,
            "flashattn %s: exact attention on CPUs, computed the FlashAttention way\n"
            "\n"
            "usage: flashattn <command> [options]      flashattn <command> --help for its options\n"
            "       flashattn --version                version and the ISA set compiled in and in use\n"
            "\n"
            "commands:\n",
            FA_VERSION);
    for (int i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out,
            "\n"
            "Exit status: 0 ok, 1 check found a mismatch, 2 bad usage or bad input.\n"
            "Example:\n"
            "  flashattn run -q q.npy -k k.npy -v v.npy -o o.npy --causal\n");
}

static const command *find(const char *name)
{
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (cli_is_help(name)) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
        if (argc > 2) return cli_die("%s takes no arguments, got '%s'", name, argv[2]);
        printf("flashattn %s\n", fa_version());
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) { /* flashattn help [command] */
        if (argc < 3) {
            usage(stdout);
            return CLI_EXIT_OK;
        }
        const command *c = find(argv[2]);
        if (!c) return cli_die("unknown command '%s' (see flashattn --help)", argv[2]);
        char help[] = "--help";
        char *args[] = {argv[2], help, NULL};
        return c->fn(2, args);
    }
    const command *c = find(name);
    if (!c) {
        if (name[0] == '-') return cli_die("unknown option '%s' (see flashattn --help)", name);
        return cli_die("unknown command '%s' (see flashattn --help)", name);
    }
    return c->fn(argc - 1, argv + 1);
}
