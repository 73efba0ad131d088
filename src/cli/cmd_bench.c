/*
 * cmd_bench.c — placeholder for `flashattn bench` until its owner replaces this
 * file; it only keeps the subcommand table in main.c linkable.
 */
#include "cli.h"

#include <stdio.h>

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "flashattn bench: not built yet\n");
    return CLI_EXIT_USAGE;
}
