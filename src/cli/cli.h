/* Shared declarations of the ctuner subcommands. Each returns the process exit code. */
#ifndef CT_CLI_H
#define CT_CLI_H

#include <stdio.h>

int ct_cmd_model(int argc, char **argv);
int ct_cmd_bench(int argc, char **argv);
int ct_cmd_bench_memory(int argc, char **argv); /* cmd_bench_memory.c */
int ct_cmd_bench_discovery(int argc, char **argv); /* cmd_bench_data.c */
int ct_cmd_bench_vae(int argc, char **argv);       /* cmd_bench_vae.c */
int ct_eval_vae(int argc, char **argv);            /* cmd_eval_vae.c */
void ct_eval_vae_usage(FILE *f);
int ct_cmd_launch(int argc, char **argv);
int ct_cmd_checkpoint(int argc, char **argv);
/* "latest:OUTPUT_DIR" (the newest complete checkpoint there) or a directory
 * into dir; prints the error and returns -1 if there is none. */
int ct_cli_checkpoint_dir(const char *cmd, const char *arg, char *dir, size_t n);
int ct_cmd_train(int argc, char **argv);
int ct_cmd_cache(int argc, char **argv); /* cmd_train.c */
int ct_cmd_sample(int argc, char **argv);
int ct_cmd_dataset(int argc, char **argv);
int ct_cmd_eval(int argc, char **argv);
int ct_cmd_storage(int argc, char **argv); /* cmd_storage.c */

/* "--key=value" or "--key value": if argv[*i] is option `key`, store its value,
 * advance *i and return 1; 0 if it is another option; -1 (message printed) if
 * the value is missing. */
int ct_cli_opt(int argc, char **argv, int *i, const char *key, const char **val);
/* Parse an integer/float option value; prints an error naming the option. */
int ct_cli_int(const char *key, const char *val, long lo, long hi, long *out);
int ct_cli_float(const char *key, const char *val, double *out);
/* Write s as a JSON string literal (quoted, escaped). */
void ct_cli_json_str(FILE *f, const char *s);

#endif
