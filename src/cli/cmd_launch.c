/* `ctuner launch`: an Accelerate config (YAML) turned into the one command
 * that runs `ctuner train` on every process of every machine: mpirun over a
 * hostfile (or a Slurm allocation), or srun with PMIx (docs/distributed.md,
 * "Launching from an Accelerate config").
 *
 * The config is read and checked by accel_yaml.c. With Open MPI one mpirun,
 * started on machine_rank 0, starts the ranks of every machine over SSH, so a
 * config with machine_rank > 0 stops with what to run on machine 0 instead.
 * main_process_port confines Open MPI's TCP ports to a range starting there,
 * so a firewall between the machines needs only that range open.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/accel.h"
#include "cli/cli.h"

void ct_cmd_launch_help(FILE *f) {
  fprintf(f,
          "usage: ctuner launch --accelerate-config FILE [--hostfile F] [--launcher mpirun|srun]\n"
          "                     [--dry-run] -- train [options]\n"
          "\n"
          "Reads an Accelerate config (num_machines, num_processes, machine_rank,\n"
          "main_process_ip, main_process_port, mixed_precision, distributed_type,\n"
          "deepspeed_config: zero_stage, gradient_accumulation_steps, gradient_clipping,\n"
          "offload_*_device, deepspeed_config_file, deepspeed_hostfile; mpirun_config:\n"
          "mpirun_hostfile) and runs `mpirun -np num_processes --map-by ppr:<per machine>:node\n"
          "... ctuner train` with the matching --zero_stage, --gradient_accumulation_steps,\n"
          "--max_grad_norm, --mixed_precision, --offload_* and --deepspeed_config before your\n"
          "own options, which win. Keys that change nothing here warn once saying why; keys\n"
          "ctuner cannot honour (FSDP, fp16, fp8, SageMaker, unknown keys) are refused by name.\n"
          "\n"
          "Several machines: run it once, on machine_rank 0; mpirun starts the ranks of\n"
          "the others over SSH, from --hostfile (one line 'HOST slots=<per machine>' per\n"
          "machine, machine 0 first; or the config's deepspeed_hostfile/mpirun_hostfile;\n"
          "inside a Slurm allocation mpirun takes Slurm's machines). A config with\n"
          "machine_rank > 0 prints what to run on machine 0 and exits 2. With\n"
          "main_process_port P, Open MPI uses TCP ports P to P+2*<per machine>+1 only.\n"
          "--launcher srun: `srun --mpi=pmix` inside a Slurm allocation instead of mpirun.\n"
          "--dry-run prints the command instead of running it.\n");
}

/* Machines listed in a hostfile (lines that are not blank or comments) and the first one. */
static int count_hosts(const char *path, char *first, size_t n) {
  FILE *f = fopen(path, "r");
  int hosts = 0;
  char line[1024];
  if (!f) return -1;
  first[0] = 0;
  while (fgets(line, sizeof line, f)) {
    char *s = line;
    while (isspace((unsigned char)*s)) s++;
    if (!*s || *s == '#') continue;
    if (!hosts++) {
      size_t k = 0;
      while (s[k] && !isspace((unsigned char)s[k]) && k + 1 < n) k++;
      memcpy(first, s, k);
      first[k] = 0;
    }
  }
  fclose(f);
  return hosts;
}

/* machine_rank > 0: with Open MPI nothing is started here; say what to do on machine 0. */
static void not_main(const char *acc, const ct_accel *c, int argc, char **argv, int i) {
  const long per = c->num_processes / c->num_machines;
  const char *ip = *c->main_process_ip ? c->main_process_ip : "<main_process_ip>";
  fprintf(stderr,
          "ctuner launch: %s has machine_rank %ld: run ctuner launch once, on machine_rank 0 "
          "(%s); mpirun starts the ranks of every machine in the hostfile, this one included, "
          "so nothing is to be run here. On machine 0, with its own config (machine_rank: 0):\n"
          "    ctuner launch --accelerate-config <its config> --hostfile hosts --",
          acc, c->machine_rank, ip);
  for (int j = i; j < argc; j++) fprintf(stderr, " %s", argv[j]);
  fprintf(stderr,
          "\n  hosts lists the %ld machines, machine 0 first, one line each:\n"
          "    %s slots=%ld\n    <machine 1> slots=%ld\n    ...\n"
          "  Every machine needs: SSH from machine 0 without a password (`ssh <machine> true` "
          "works), ctuner, the configs and the data at the same paths, and the TCP ports Open MPI "
          "uses open between the machines: ",
          c->num_machines, ip, per, per);
  if (c->main_process_port > 0)
    fprintf(stderr, "%ld-%ld (from main_process_port).\n", c->main_process_port,
            c->main_process_port + 2 * per + 1);
  else
    fprintf(stderr,
            "any (set main_process_port to confine them to main_process_port .. "
            "main_process_port+%ld).\n",
            2 * per + 1);
  fprintf(stderr,
          "  In a Slurm allocation use `ctuner launch --launcher srun ...` once instead "
          "(docs/distributed.md).\n");
}

/* The machines: --hostfile, the config's, or Slurm's allocation; checked. 0 or -1. */
static int pick_hostfile(const char *acc, const ct_accel *c, const char **hostfile, int srun) {
  const long per = c->num_processes / c->num_machines;
  const char *ip = *c->main_process_ip ? c->main_process_ip : "<main_process_ip>";
  if (!*hostfile && c->hostfile_key) *hostfile = c->hostfile;
  const char *nodes = getenv("SLURM_JOB_NUM_NODES"); /* inside an allocation */
  if ((srun || (!*hostfile && getenv("SLURM_JOB_ID"))) && nodes && atol(nodes) != c->num_machines) {
    fprintf(stderr,
            "ctuner launch: the Slurm allocation has %s node(s); %s says num_machines %ld (sbatch "
            "--nodes=%ld --ntasks-per-node=%ld)\n",
            nodes, acc, c->num_machines, c->num_machines, per);
    return -1;
  }
  if (srun) {
    if (*hostfile) {
      fprintf(stderr,
              "ctuner launch: --launcher srun takes the machines from Slurm; a hostfile (%s) is "
              "not used: choose the machines with sbatch --nodelist instead\n",
              *hostfile);
      return -1;
    }
    return 0;
  }
  if (!*hostfile) {
    if (c->num_machines > 1 && !getenv("SLURM_JOB_ID")) {
      fprintf(stderr,
              "ctuner launch: num_machines %ld needs --hostfile listing the machines, one per line "
              "as 'HOST slots=%ld', %s first (or run inside a Slurm allocation)\n",
              c->num_machines, per, ip);
      return -1;
    }
    return 0;
  }
  char first[256];
  const int hosts = count_hosts(*hostfile, first, sizeof first);
  if (hosts < 0) {
    fprintf(stderr, "ctuner launch: hostfile %s%s%s: %s\n", *hostfile,
            c->hostfile_key && *hostfile == c->hostfile ? " from " : "",
            c->hostfile_key && *hostfile == c->hostfile ? c->hostfile_key : "", strerror(errno));
    return -1;
  }
  if (hosts < c->num_machines) {
    fprintf(stderr, "ctuner launch: hostfile %s lists %d machine(s); %s says num_machines %ld\n",
            *hostfile, hosts, acc, c->num_machines);
    return -1;
  }
  if (hosts > c->num_machines)
    fprintf(stderr,
            "ctuner launch: warning: hostfile %s lists %d machines; the first %ld are used\n",
            *hostfile, hosts, c->num_machines);
  if (*c->main_process_ip && strcmp(first, c->main_process_ip))
    fprintf(stderr,
            "ctuner launch: warning: rank 0 runs on %s, the hostfile's first machine, not on "
            "main_process_ip %s (the same machine by another name is fine)\n",
            first, c->main_process_ip);
  return 0;
}

static void print_quoted(const char *a) {
  int plain = *a != 0;
  for (const char *p = a; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("-_./=:,+@%", *p)) plain = 0;
  if (plain) {
    fputs(a, stdout);
    return;
  }
  putchar('\'');
  for (const char *p = a; *p; p++) {
    if (*p == '\'')
      fputs("'\\''", stdout);
    else
      putchar(*p);
  }
  putchar('\'');
}

/* The strings the launcher's part of the command points to (they live until exec). */
typedef struct launch_bufs {
  char np[32], ppr[64], oob[64], bmin[32], brange[32], nodes[32], ntasks[32], pernode[40];
  char exp[384];
} launch_bufs;

/* mpirun (or srun) and its options into av from k; returns the new k. With
 * several machines and main_process_port P, Open MPI's daemons listen at
 * P..P+per and the ranks at P+per+1..P+2per+1, IPv4 and IPv6 alike. */
static int add_launcher(char **av, int k, launch_bufs *b, const ct_accel *c, const char *hostfile,
                        int srun) {
  const long per = c->num_processes / c->num_machines, P = c->main_process_port;
  const int ports = c->num_machines > 1 && P > 0;
  snprintf(b->np, sizeof b->np, "%ld", c->num_processes);
  snprintf(b->ppr, sizeof b->ppr, "ppr:%ld:node", per);
  snprintf(b->oob, sizeof b->oob, "%ld-%ld", P, P + per);
  snprintf(b->bmin, sizeof b->bmin, "%ld", P + per + 1);
  snprintf(b->brange, sizeof b->brange, "%ld", per + 1);
  if (srun) {
    snprintf(b->nodes, sizeof b->nodes, "--nodes=%ld", c->num_machines);
    snprintf(b->ntasks, sizeof b->ntasks, "--ntasks=%ld", c->num_processes);
    snprintf(b->pernode, sizeof b->pernode, "--ntasks-per-node=%ld", per);
    av[k++] = "srun";
    av[k++] = "--mpi=pmix";
    av[k++] = b->nodes;
    av[k++] = b->ntasks;
    av[k++] = b->pernode;
    if (ports) { /* the ranks' TCP ports; srun's own wire-up is Slurm's (PMIx) */
      snprintf(b->exp, sizeof b->exp,
               "--export=ALL,OMPI_MCA_btl_tcp_port_min_v4=%s,OMPI_MCA_btl_tcp_port_range_v4=%s,"
               "OMPI_MCA_btl_tcp_port_min_v6=%s,OMPI_MCA_btl_tcp_port_range_v6=%s",
               b->bmin, b->brange, b->bmin, b->brange);
      av[k++] = b->exp;
    }
    return k;
  }
  av[k++] = "mpirun";
  if (getuid() == 0) av[k++] = "--allow-run-as-root";
  av[k++] = "-np";
  av[k++] = b->np;
  av[k++] = "--map-by";
  av[k++] = b->ppr;
  if (hostfile) {
    av[k++] = "--hostfile";
    av[k++] = (char *)hostfile;
  } else if (c->num_machines == 1) {
    av[k++] = "--oversubscribe"; /* one machine: allow more ranks than cores */
  }
  if (c->num_machines > 1) { /* ranks talk over TCP between machines */
    av[k++] = "--mca";
    av[k++] = "btl";
    av[k++] = "tcp,self,vader";
  }
  if (ports) { /* each address family listens on its own sockets */
    static const char *const opt[] = {"oob_tcp_dynamic_ipv4_ports", "oob_tcp_dynamic_ipv6_ports",
                                      "btl_tcp_port_min_v4",        "btl_tcp_port_range_v4",
                                      "btl_tcp_port_min_v6",        "btl_tcp_port_range_v6"};
    const char *val[] = {b->oob, b->oob, b->bmin, b->brange, b->bmin, b->brange};
    for (int q = 0; q < 6; q++) {
      av[k++] = "--mca";
      av[k++] = (char *)opt[q];
      av[k++] = (char *)val[q];
    }
  }
  return k;
}

/* The train options an Accelerate config sets (they live until exec). */
typedef struct accel_bufs {
  char zs[32], ga[64], dsf[1100], mp[64], oo[64], op[64], nvp[1100], gc[96];
} accel_bufs;

/* What the Accelerate config says, as train options into av from k; they
 * come before the user's own options after '--', which therefore win (ctuner
 * train applies options in order). Returns the new k. */
static int add_accel_opts(char **av, int k, accel_bufs *b, const ct_accel *c) {
  snprintf(b->zs, sizeof b->zs, "--zero_stage=%ld", c->zero_stage);
  snprintf(b->ga, sizeof b->ga, "--gradient_accumulation_steps=%ld", c->grad_accum);
  snprintf(b->dsf, sizeof b->dsf, "--deepspeed_config=%s", c->ds_file);
  snprintf(b->mp, sizeof b->mp, "--mixed_precision=%s", c->mixed_precision);
  snprintf(b->gc, sizeof b->gc, "--max_grad_norm=%s", c->grad_clip); /* DeepSpeed's global clip */
  snprintf(b->oo, sizeof b->oo, "--offload_optimizer=%s", c->offload_opt);
  snprintf(b->op, sizeof b->op, "--offload_param=%s", c->offload_param);
  snprintf(b->nvp, sizeof b->nvp, "--offload_param_path=%s", c->nvme_path);
  if (c->zero_stage >= 0) av[k++] = b->zs;
  if (c->grad_accum > 0) av[k++] = b->ga;
  if (*c->mixed_precision) av[k++] = b->mp; /* absent: the training config's own */
  if (*c->grad_clip) av[k++] = b->gc;
  if (*c->offload_opt) av[k++] = b->oo;
  if (*c->offload_param) av[k++] = b->op;
  if (*c->nvme_path) av[k++] = b->nvp;
  if (*c->ds_file) av[k++] = b->dsf;
  return k;
}

int ct_cmd_launch(int argc, char **argv) {
  const char *acc = NULL, *hostfile = NULL, *launcher = "mpirun";
  int dry = 0, i = 1, rc = 2;
  char **av = NULL;
  for (; i < argc; i++) {
    int r;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      ct_cmd_launch_help(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--dry-run")) {
      dry = 1;
    } else if (!strcmp(argv[i], "--")) {
      i++;
      break;
    } else if ((r = ct_cli_opt(argc, argv, &i, "accelerate-config", &acc)) ||
               (r = ct_cli_opt(argc, argv, &i, "hostfile", &hostfile)) ||
               (r = ct_cli_opt(argc, argv, &i, "launcher", &launcher))) {
      if (r < 0) return 2;
    } else {
      fprintf(stderr, "ctuner launch: unknown option '%s' (the command follows '--')\n", argv[i]);
      ct_cmd_launch_help(stderr);
      return 2;
    }
  }
  if (!acc) {
    fprintf(stderr, "ctuner launch: --accelerate-config FILE is required\n");
    ct_cmd_launch_help(stderr);
    return 2;
  }
  if (strcmp(launcher, "mpirun") && strcmp(launcher, "srun")) {
    fprintf(stderr, "ctuner launch: --launcher %s: use mpirun or srun\n", launcher);
    return 2;
  }
  const int srun = !strcmp(launcher, "srun");
  if (i >= argc || strcmp(argv[i], "train")) {
    fprintf(stderr, "ctuner launch: expected '-- train [options]' after the launch options\n");
    return 2;
  }
  ct_accel c;
  if (ct_accel_load(acc, &c)) return 2;
  if (c.machine_rank != 0) {
    not_main(acc, &c, argc, argv, i);
    return 2;
  }
  if (pick_hostfile(acc, &c, &hostfile, srun)) return 2;
  const long per = c.num_processes / c.num_machines;
  const long P = c.main_process_port;
  const int ports = c.num_machines > 1 && P > 0;
  if (ports && P + 2 * per + 1 > 65535) {
    fprintf(stderr,
            "ctuner launch: main_process_port %ld: Open MPI's ports %ld-%ld pass 65535; choose a "
            "lower port\n",
            P, P, P + 2 * per + 1);
    return 2;
  }
  if (c.num_machines > 1 && c.same_network == 0)
    fprintf(stderr,
            "ctuner launch: note: same_network false: Open MPI connects the machines over the "
            "interfaces that reach each other; if it picks a wrong one, set "
            "OMPI_MCA_btl_tcp_if_include=<subnet> (and OMPI_MCA_oob_tcp_if_include)\n");
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    snprintf(self, sizeof self, "ctuner");
  else
    self[n] = 0;
  launch_bufs lb;
  accel_bufs ab;
  av = calloc((size_t)argc + 48, sizeof *av);
  if (!av) return 1;
  int k = add_launcher(av, 0, &lb, &c, hostfile, srun);
  av[k++] = self;
  av[k++] = argv[i]; /* "train" */
  k = add_accel_opts(av, k, &ab, &c);
  for (int j = i + 1; j < argc; j++) av[k++] = argv[j];
  av[k] = NULL;
  fprintf(stderr,
          "ctuner launch: %ld machine(s) x %ld process(es) = %ld ranks, distributed_type %s, "
          "zero_stage %s\n",
          c.num_machines, per, c.num_processes, c.distributed_type,
          c.zero_stage >= 0 ? ab.zs + 13 : "from the config");
  if (dry) {
    for (int j = 0; j < k; j++) {
      if (j) putchar(' ');
      print_quoted(av[j]);
    }
    putchar('\n');
    rc = 0;
    goto out;
  }
  fflush(stdout);
  execvp(av[0], av);
  fprintf(stderr, "ctuner launch: cannot run %s: %s (%s)\n", av[0], strerror(errno),
          srun ? "srun is Slurm's; run inside an allocation (salloc/sbatch)"
               : "scripts/deps.sh installs openmpi-bin");
  rc = 1;
out:
  free(av);
  return rc;
}
