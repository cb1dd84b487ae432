/*
 * weftrun - starts N local ranks of a program and wires the weft environment.
 *
 *   weftrun -n 4 ./all_reduce_perf -b 8 -e 128M
 *   weftrun -n 2 --timeout 60 --env WEFT_DEBUG=INFO ./trainer
 *
 * It binds the rendezvous socket itself (127.0.0.1, port 0, or --bind ADDR)
 * and hands it to rank 0 as WEFT_ROOT_FD, so rank 0 never races anyone for
 * the port; every rank gets WEFT_UNIQUE_ID, WEFT_RANK, WEFT_NRANKS,
 * WEFT_LOCAL_RANK and WEFT_LOCAL_SIZE.  Output comes back line by line,
 * prefixed "[rank] ".  When one rank fails, the others are stopped
 * (SIGTERM, then SIGKILL after --kill-grace) and weftrun exits with the
 * failing rank's status.  One host only: clusters launch with srun/mpirun.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"

#define MAX_RANKS 4096
#define READ_CHUNK (16u << 10)      /* bytes read per wakeup, at most */
#define LINE_MAX_BYTES (1u << 20)   /* longer lines are split */
#define SCRATCH_BYTES (256u << 10)  /* prefixed output is batched here */
#define DRAIN_NS 1000000000ull      /* output still read after the last rank exits */

static const char usage_text[] =
    "usage: weftrun -n N [options] PROG [ARGS...]\n"
    "Starts N ranks of PROG on this host, wired for weft_comm_init_env().\n"
    "  -n, --np N            number of ranks (1..4096; default: the hostfile's slots)\n"
    "      --bind ADDR       local address of the rendezvous socket (default 127.0.0.1)\n"
    "      --iface NAME      set WEFT_SOCKET_IFNAME=NAME for the ranks\n"
    "  -x, --env K=V         extra environment for the ranks (repeatable)\n"
    "      --hostfile FILE   'host [slots=N]' lines; only this host is accepted\n"
    "      --timeout SEC     stop the job after SEC seconds (exit status 124)\n"
    "      --kill-grace SEC  wait between SIGTERM and SIGKILL when stopping (default 3)\n"
    "      --no-prefix       do not prefix output lines with \"[rank] \"\n"
    "      --output WHICH    all (default) or rank0: only rank 0's stdout is shown\n"
    "  -q                    same as --output rank0\n"
    "  -h, --help            this text\n"
    "      --version         weftrun's version\n"
    "stdin goes to rank 0 (unless it is a terminal); the others read /dev/null.\n";

/* The command line; strings point into argv.  Filled once by opts_parse. */
struct opts {
    int nranks;          /* 0 until given or read from the hostfile */
    const char *bind;    /* NULL: loopback */
    const char *iface;
    const char *hostfile;
    double timeout_s;    /* 0: none */
    double grace_s;
    bool prefix;
    bool rank0_only;
    char **env;          /* nenv "K=V" strings */
    int nenv;
    char **prog;         /* program and its arguments, NULL-terminated */
};

/* One output pipe of one rank.  buf holds the bytes of lines not yet
 * complete (len <= cap <= LINE_MAX_BYTES); fd is -1 after EOF. */
struct stream {
    int fd;
    int rank;
    int dest;            /* 1, 2, or -1 to read and drop */
    char *buf;
    size_t len, cap;
};

enum stop_reason { STOP_NONE, STOP_FAIL, STOP_TIMEOUT, STOP_SIGNAL, STOP_SPAWN };

/* The running job, owned by main.  running counts ranks not yet reaped;
 * a rank's pid stays valid (we have not reaped it) while !reaped, which is
 * what makes signalling it safe.  The first stop reason sticks. */
struct job {
    const struct opts *o;
    int n;
    pid_t *pids;
    bool *reaped;
    struct stream *streams;  /* 2 * n: stdout, stderr of rank 0, then rank 1... */
    pid_t pgid;              /* rank 0's pid; 0 before it exists */
    int running;
    int open;                /* streams not at EOF yet */
    int sigfd;
    sigset_t oldmask;        /* restored in the children */
    struct rlimit nofile;    /* the caller's limit, restored in the children */
    enum stop_reason stop;
    int stop_sig;            /* STOP_SIGNAL: what we got */
    int fail_rank, fail_status;
    int stopped;             /* ranks still running when the stop began */
    uint64_t deadline_ns;    /* --timeout; 0 none */
    uint64_t kill_at_ns;     /* SIGKILL then; 0 none */
    struct pollfd *pfd;      /* 2 * n + 1: job_run's poll set ... */
    struct stream **who;     /* ... and whose each entry is */
    size_t olen;             /* bytes waiting in scratch, all for one fd */
    char scratch[SCRATCH_BYTES];
};

static const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
static bool out_dead[3]; /* a closed stdout/stderr: keep draining, drop the bytes */

static void out_write(int fd, const char *p, size_t n)
{
    while (n > 0 && !out_dead[fd]) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, -1);
        } else if (!(w < 0 && errno == EINTR)) {
            out_dead[fd] = true;
        }
    }
}

static void close_fd(int fd)
{
    if (fd >= 0)
        close(fd);
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "weftrun: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage_text);
    return 2;
}

/* A number in [lo, hi], a whole one when asked. */
static bool parse_num(const char *s, double lo, double hi, bool whole, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi) || (whole && v != floor(v)))
        return false;
    *out = v;
    return true;
}

/* 0 to go on, otherwise the exit status (help and version return -1). */
static int opts_parse(int argc, char **argv, struct opts *o)
{
    enum { O_BIND = 256, O_IFACE, O_HOSTFILE, O_TIMEOUT, O_GRACE, O_NOPREFIX, O_OUTPUT, O_VERSION };
    static const struct option longopts[] = {
        {"np", required_argument, NULL, 'n'},       {"env", required_argument, NULL, 'x'},
        {"bind", required_argument, NULL, O_BIND},  {"iface", required_argument, NULL, O_IFACE},
        {"hostfile", required_argument, NULL, O_HOSTFILE},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"kill-grace", required_argument, NULL, O_GRACE},
        {"no-prefix", no_argument, NULL, O_NOPREFIX},
        {"output", required_argument, NULL, O_OUTPUT},
        {"help", no_argument, NULL, 'h'},           {"version", no_argument, NULL, O_VERSION},
        {NULL, 0, NULL, 0},
    };
    *o = (struct opts){.grace_s = 3, .prefix = true};
    o->env = calloc((size_t)argc, sizeof(*o->env));
    if (!o->env)
        return fprintf(stderr, "weftrun: out of memory\n"), 1;
    opterr = 0;
    int c;
    double v;
    /* '+': the first non-option is the program; its options are its own. */
    while ((c = getopt_long(argc, argv, "+:n:x:qh", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (!parse_num(optarg, 1, MAX_RANKS, true, &v))
                return usage_error("-n wants a rank count from 1 to 4096, not '%s'", optarg);
            o->nranks = (int)v;
            break;
        case 'x':
            if (!strchr(optarg, '=') || optarg[0] == '=')
                return usage_error("--env wants KEY=VALUE, not '%s'", optarg);
            o->env[o->nenv++] = optarg;
            break;
        case 'q': o->rank0_only = true; break;
        case O_BIND: o->bind = optarg; break;
        case O_IFACE: o->iface = optarg; break;
        case O_HOSTFILE: o->hostfile = optarg; break;
        case O_NOPREFIX: o->prefix = false; break;
        case O_TIMEOUT:
            if (!parse_num(optarg, 0.001, 1e8, false, &o->timeout_s))
                return usage_error("--timeout wants a positive number of seconds, not '%s'", optarg);
            break;
        case O_GRACE:
            if (!parse_num(optarg, 0, 1e8, false, &o->grace_s))
                return usage_error("--kill-grace wants a number of seconds, not '%s'", optarg);
            break;
        case O_OUTPUT:
            if (strcmp(optarg, "all") && strcmp(optarg, "rank0"))
                return usage_error("--output wants 'all' or 'rank0', not '%s'", optarg);
            o->rank0_only = !strcmp(optarg, "rank0");
            break;
        case 'h': fputs(usage_text, stdout); return -1;
        case O_VERSION:
            printf("weftrun (weft) %d.%d.%d\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
                   WEFT_VERSION_PATCH);
            return -1;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default:
            if (optopt) {
                char opt[3] = {'-', (char)optopt, '\0'};
                return usage_error("unknown option %s", opt);
            }
            return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return usage_error("no program to run%s", "");
    o->prog = argv + optind;
    return 0;
}

/* "node1" names this host when it is our hostname or its short form. */
static bool host_is_local(const char *h)
{
    struct in_addr a4;
    if (!strcmp(h, "localhost") || !strncmp(h, "localhost.", 10) || !strcmp(h, "::1"))
        return true;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    char me[256];
    if (gethostname(me, sizeof(me)) != 0)
        return false;
    me[sizeof(me) - 1] = '\0';
    size_t hs = strcspn(h, "."), ms = strcspn(me, ".");
    return !strcmp(h, me) || (hs == strlen(h) && hs == ms && !strncmp(h, me, hs)) ||
           (ms == strlen(me) && hs == ms && !strncmp(h, me, ms));
}

/* Reads the hostfile; 0 when every host is this one (*slots: their sum). */
static int hostfile_check(const char *path, int *slots)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fprintf(stderr, "weftrun: cannot open hostfile %s: %s\n", path, strerror(errno)), 2;
    char line[1024], remote[256] = "";
    int lineno = 0, rc = 0, hosts = 0;
    *slots = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "#\n")] = '\0';
        char *save, *host = strtok_r(line, " \t\r", &save), *tok;
        if (!host)
            continue;
        int n = 1;
        while ((tok = strtok_r(NULL, " \t\r", &save))) {
            char *end;
            long v = !strncmp(tok, "slots=", 6) ? strtol(tok + 6, &end, 10) : -1;
            if (v < 1 || v > MAX_RANKS || *end) {
                fprintf(stderr, "weftrun: %s:%d: expected 'host [slots=N]', got '%s'\n", path,
                        lineno, tok);
                rc = 2;
                break;
            }
            n = (int)v;
        }
        hosts++;
        *slots = WEFT_MIN(*slots + n, MAX_RANKS);
        if (!host_is_local(host) && !remote[0])
            snprintf(remote, sizeof(remote), "%s", host);
    }
    fclose(f);
    if (rc == 0 && remote[0]) {
        fprintf(stderr,
                "weftrun: hostfile %s names another host (%s); weftrun starts ranks on this host "
                "only.\nweftrun: launch across hosts with srun or mpirun: weft_comm_init_env() "
                "reads their rank variables.\n",
                path, remote);
        rc = 2;
    } else if (rc == 0 && hosts == 0) {
        fprintf(stderr, "weftrun: hostfile %s lists no hosts\n", path);
        rc = 2;
    }
    return rc;
}

/* Binds the root's listener; fills the variables every rank shares. */
static int rendezvous_setup(const struct opts *o, int *lfd)
{
    union weft_sockaddr addr;
    char spec[300];
    const char *host = o->bind ? o->bind : "127.0.0.1";
    bool v6 = strchr(host, ':') && host[0] != '[';
    /* weft_sock_parse wants a real port; the listener wants 0 (any). */
    snprintf(spec, sizeof(spec), v6 ? "[%s]:1" : "%s:1", host);
    if (weft_sock_parse(spec, &addr) != WEFT_OK)
        return fprintf(stderr, "weftrun: --bind %s: %s\n", host, weft_last_error(NULL)), 2;
    if (addr.sa.sa_family == AF_INET6)
        addr.in6.sin6_port = 0;
    else
        addr.in.sin_port = 0;
    if (weft_sock_listen(&addr, lfd) != WEFT_OK)
        return fprintf(stderr, "weftrun: cannot listen on %s: %s\n", host, weft_last_error(NULL)),
               1;
    fcntl(*lfd, F_SETFD, FD_CLOEXEC); /* only rank 0 may inherit it */
    weft_unique_id_t id;
    char hex[WEFT_UID_HEX_LEN], num[16];
    if (weft_uid_make(&id, &addr, NULL) != WEFT_OK) {
        fprintf(stderr, "weftrun: cannot make the unique id: %s\n", weft_last_error(NULL));
        goto fail;
    }
    weft_uid_to_hex(&id, hex);
    snprintf(num, sizeof(num), "%d", o->nranks);
    int bad = setenv("WEFT_UNIQUE_ID", hex, 1) | setenv("WEFT_NRANKS", num, 1) |
              setenv("WEFT_LOCAL_SIZE", num, 1);
    if (o->iface)
        bad |= setenv("WEFT_SOCKET_IFNAME", o->iface, 1);
    for (int i = 0; i < o->nenv; i++)
        bad |= putenv(o->env[i]); /* last, so the user may override ours */
    if (!bad)
        return 0;
    fprintf(stderr, "weftrun: cannot set the environment: %s\n", strerror(errno));
fail:
    close(*lfd);
    *lfd = -1;
    return 1;
}

/* In the child between fork and exec: joins the job, wires fds and the
 * per-rank variables, and runs the program.  Never returns. */
static void __attribute__((noreturn))
child_exec(const struct job *j, int rank, pid_t parent, int lfd, int out_w, int err_w)
{
    char num[16];
    setpgid(0, j->pgid);
    /* Die with weftrun; a weftrun that died before prctl is caught by getppid. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(1);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &j->oldmask, NULL);
    setrlimit(RLIMIT_NOFILE, &j->nofile);
    if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        _exit(1);
    if (rank != 0 || isatty(0)) { /* a background group reading a tty would stop */
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (nul < 0 || dup2(nul, 0) < 0)
            _exit(1);
    }
    if (rank == 0) {
        snprintf(num, sizeof(num), "%d", lfd);
        if (fcntl(lfd, F_SETFD, 0) != 0 || setenv(WEFT_ROOT_FD_ENV, num, 1) != 0)
            _exit(1);
    } else {
        unsetenv(WEFT_ROOT_FD_ENV);
    }
    snprintf(num, sizeof(num), "%d", rank);
    if (setenv("WEFT_RANK", num, 1) != 0 || setenv("WEFT_LOCAL_RANK", num, 1) != 0)
        _exit(1);
    execvp(j->o->prog[0], j->o->prog);
    int err = errno;
    fprintf(stderr, "weftrun: cannot run %s: %s\n", j->o->prog[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}

/* Signals every rank still running, one by one (a rank may have left the
 * group), and the group while it may have members: a rank, or whatever
 * still holds a pipe open (a rank's children). */
static void job_signal(struct job *j, int sig)
{
    if (j->pgid > 0 && (j->running > 0 || j->open > 0))
        kill(-j->pgid, sig);
    for (int r = 0; r < j->n; r++)
        if (j->pids[r] > 0 && !j->reaped[r])
            kill(j->pids[r], sig);
}

static void job_stop(struct job *j, enum stop_reason why, int sig)
{
    if (j->stop == STOP_NONE) {
        j->stop = why;
        j->stopped = j->running;
    }
    job_signal(j, sig);
    if (j->kill_at_ns == 0)
        j->kill_at_ns = weft_now_ns() + (uint64_t)(j->o->grace_s * 1e9) + 1;
}

/* Starts the ranks; on failure the started ones are left to job_run. */
static int job_spawn(struct job *j, int lfd)
{
    pid_t parent = getpid();
    for (int r = 0; r < j->n; r++) {
        int out[2] = {-1, -1}, err[2] = {-1, -1};
        pid_t pid = -1;
        if (pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0 && (pid = fork()) == 0)
            child_exec(j, r, parent, lfd, out[1], err[1]);
        int e = errno;
        close_fd(out[1]);
        close_fd(err[1]);
        if (pid < 0) {
            close_fd(out[0]);
            close_fd(err[0]);
            fprintf(stderr, "weftrun: cannot start rank %d: %s%s\n", r, strerror(e),
                    e == EMFILE ? " (2 pipes per rank: raise ulimit -n)" : "");
            return 1;
        }
        if (r == 0)
            j->pgid = pid;
        setpgid(pid, j->pgid); /* also here, so no signal finds it outside the group */
        j->pids[r] = pid;
        j->running++;
        int fds[2] = {out[0], err[0]};
        for (int k = 0; k < 2; k++) {
            struct stream *s = &j->streams[2 * r + k];
            fcntl(fds[k], F_SETFL, O_NONBLOCK);
            s->fd = fds[k];
            j->open++;
            s->dest = (k == 0 && j->o->rank0_only && r != 0) ? -1 : k + 1;
        }
    }
    return 0;
}

/* Batches output in j->scratch; n == 0 writes the batch out.  What does
 * not fit goes straight out: only this process writes, so lines stay whole. */
static void out_put(struct job *j, int fd, const char *p, size_t n)
{
    if (j->olen > 0 && (n == 0 || j->olen + n > sizeof(j->scratch))) {
        out_write(fd, j->scratch, j->olen);
        j->olen = 0;
    }
    if (n > sizeof(j->scratch)) {
        out_write(fd, p, n);
    } else if (n > 0) {
        memcpy(j->scratch + j->olen, p, n);
        j->olen += n;
    }
}

/* Writes out the complete lines of s; with force, also the partial last
 * line (EOF, or a line that fills a buffer that cannot grow). */
static void stream_flush(struct job *j, struct stream *s, bool force)
{
    char pre[24];
    size_t plen = j->o->prefix ? (size_t)snprintf(pre, sizeof(pre), "[%d] ", s->rank) : 0;
    size_t done = 0;
    if (s->len == 0)
        return;
    while (done < s->len) {
        char *nl = memchr(s->buf + done, '\n', s->len - done);
        size_t line = nl ? (size_t)(nl - (s->buf + done)) + 1 : s->len - done;
        if (!nl && !force)
            break;
        if (s->dest > 0) {
            out_put(j, s->dest, pre, plen);
            out_put(j, s->dest, s->buf + done, line);
            if (!nl)
                out_put(j, s->dest, "\n", 1);
        }
        done += line;
    }
    out_put(j, s->dest, NULL, 0);
    memmove(s->buf, s->buf + done, s->len - done);
    s->len -= done;
}

static void stream_close(struct job *j, struct stream *s)
{
    close(s->fd);
    s->fd = -1;
    j->open--;
}

static void stream_read(struct job *j, struct stream *s)
{
    if (s->cap - s->len < READ_CHUNK && s->cap < LINE_MAX_BYTES) {
        size_t ncap = WEFT_MIN((size_t)LINE_MAX_BYTES, s->cap ? 2 * s->cap : 4 * READ_CHUNK);
        char *nb = realloc(s->buf, ncap);
        if (nb) {
            s->buf = nb;
            s->cap = ncap;
        }
    }
    if (s->len == s->cap) /* no room left to wait for the newline */
        stream_flush(j, s, true);
    if (s->cap == 0) { /* nothing could be allocated: better lose output than spin */
        fprintf(stderr, "weftrun: out of memory; dropping the output of rank %d\n", s->rank);
        stream_close(j, s);
        return;
    }
    ssize_t got = read(s->fd, s->buf + s->len, WEFT_MIN((size_t)READ_CHUNK, s->cap - s->len));
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (got > 0) {
        s->len += (size_t)got;
        stream_flush(j, s, false);
        return;
    }
    stream_flush(j, s, true); /* EOF or error: a partial last line gets its newline */
    stream_close(j, s);
}

/* Reaps every rank that exited; the first failure stops the job, after
 * the whole batch so that ranks already gone do not count as stopped. */
static void job_reap(struct job *j)
{
    int st, fail = -1;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        int r = 0;
        while (r < j->n && j->pids[r] != pid)
            r++;
        if (r == j->n || j->reaped[r])
            continue;
        j->reaped[r] = true;
        j->running--;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && fail < 0 && j->stop == STOP_NONE) {
            fail = r;
            j->fail_status = st;
        }
    }
    if (fail >= 0) {
        j->fail_rank = fail;
        job_stop(j, STOP_FAIL, SIGTERM);
    }
}

static void job_on_signal(struct job *j)
{
    struct signalfd_siginfo si;
    while (read(j->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            job_reap(j);
        } else if (j->stop != STOP_NONE) {
            job_signal(j, SIGKILL); /* already stopping: no more grace */
        } else {
            j->stop_sig = sig;
            job_stop(j, STOP_SIGNAL, sig);
        }
    }
}

static int ms_until(uint64_t now, uint64_t t)
{
    return t == 0 ? -1 : t <= now ? 0 : (int)WEFT_MIN((t - now + 999999) / 1000000, 1u << 30);
}

/* Relays output and watches the ranks until all have exited and their
 * output is drained (or DRAIN_NS after the last exit). */
static void job_run(struct job *j)
{
    struct pollfd *pfd = j->pfd;
    struct stream **who = j->who;
    uint64_t drain_until = 0;
    for (;;) {
        uint64_t now = weft_now_ns();
        if (j->running == 0 && drain_until == 0) /* when stopping: after the SIGKILL too */
            drain_until = WEFT_MAX(now, j->kill_at_ns) + DRAIN_NS;
        if (j->stop == STOP_NONE && j->deadline_ns && now >= j->deadline_ns)
            job_stop(j, STOP_TIMEOUT, SIGTERM);
        if (j->kill_at_ns && now >= j->kill_at_ns) {
            job_signal(j, SIGKILL);
            j->kill_at_ns = 0;
        }
        int nfd = 1, timeout = -1;
        pfd[0] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
        for (int i = 0; i < 2 * j->n; i++) {
            if (j->streams[i].fd >= 0) {
                who[nfd] = &j->streams[i];
                pfd[nfd++] = (struct pollfd){.fd = j->streams[i].fd, .events = POLLIN};
            }
        }
        if (j->running == 0 && (nfd == 1 || now >= drain_until))
            break;
        uint64_t wake[3] = {j->running ? 0 : drain_until, j->stop ? 0 : j->deadline_ns,
                            j->kill_at_ns};
        for (int k = 0; k < 3; k++) {
            int ms = ms_until(now, wake[k]);
            if (ms >= 0 && (timeout < 0 || ms < timeout))
                timeout = ms;
        }
        if (poll(pfd, (nfds_t)nfd, timeout) < 0 && errno != EINTR) {
            fprintf(stderr, "weftrun: poll: %s\n", strerror(errno));
            job_stop(j, STOP_SPAWN, SIGKILL);
            return;
        }
        for (int i = 1; i < nfd; i++)
            if (pfd[i].revents)
                stream_read(j, who[i]);
        if (pfd[0].revents)
            job_on_signal(j);
    }
    for (int i = 0; i < 2 * j->n; i++) { /* lingering writers (grandchildren) */
        if (j->streams[i].fd >= 0) {
            stream_flush(j, &j->streams[i], true);
            stream_close(j, &j->streams[i]);
        }
    }
}

/* The one closing line and the exit status. */
static int job_report(const struct job *j)
{
    char tail[96] = "";
    int n = j->stopped;
    bool fail = j->stop == STOP_FAIL;
    if (n > 0)
        snprintf(tail, sizeof(tail), "; stopped %s%d rank%s%s",
                 fail && n == j->n - 1 ? "the other " : "", n, n == 1 ? "" : "s",
                 fail && n < j->n - 1 ? " still running" : "");
    switch (j->stop) {
    case STOP_NONE: return 0;
    case STOP_FAIL: {
        int st = j->fail_status, r = j->fail_rank;
        if (WIFSIGNALED(st)) {
            fprintf(stderr, "weftrun: rank %d (pid %d) killed by signal %d (%s)%s\n", r,
                    (int)j->pids[r], WTERMSIG(st), strsignal(WTERMSIG(st)), tail);
            return 128 + WTERMSIG(st);
        }
        fprintf(stderr, "weftrun: rank %d (pid %d) exited with status %d%s\n", r, (int)j->pids[r],
                WEXITSTATUS(st), tail);
        return WEXITSTATUS(st);
    }
    case STOP_TIMEOUT:
        fprintf(stderr, "weftrun: timed out after %g s%s\n", j->o->timeout_s, tail);
        return 124;
    case STOP_SIGNAL:
        fprintf(stderr, "weftrun: got signal %d (%s), passed it to the ranks%s\n", j->stop_sig,
                strsignal(j->stop_sig), tail);
        return 128 + j->stop_sig;
    case STOP_SPAWN: return 1;
    }
    return 1;
}

/* Blocks the signals we handle (read through sigfd), ignores SIGPIPE and
 * raises the fd limit: 2 pipes per rank. */
static int job_init(struct job *j, const struct opts *o)
{
    memset(j, 0, sizeof(*j));
    j->o = o;
    j->n = o->nranks;
    j->sigfd = -1;
    j->pids = calloc((size_t)j->n, sizeof(*j->pids));
    j->reaped = calloc((size_t)j->n, sizeof(*j->reaped));
    j->streams = calloc(2 * (size_t)j->n, sizeof(*j->streams));
    j->pfd = calloc(2 * (size_t)j->n + 1, sizeof(*j->pfd));
    j->who = calloc(2 * (size_t)j->n + 1, sizeof(*j->who));
    for (int i = 0; j->streams && i < 2 * j->n; i++) /* before any return: job_free closes */
        j->streams[i] = (struct stream){.fd = -1, .rank = i / 2, .dest = -1};
    if (!j->pids || !j->reaped || !j->streams || !j->pfd || !j->who)
        return fprintf(stderr, "weftrun: out of memory\n"), 1;
    if (o->timeout_s > 0)
        j->deadline_ns = weft_now_ns() + (uint64_t)(o->timeout_s * 1e9);
    getrlimit(RLIMIT_NOFILE, &j->nofile);
    struct rlimit more = {.rlim_cur = j->nofile.rlim_max, .rlim_max = j->nofile.rlim_max};
    setrlimit(RLIMIT_NOFILE, &more);
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(handled_signals); i++)
        sigaddset(&set, handled_signals[i]);
    signal(SIGPIPE, SIG_IGN);
    if (sigprocmask(SIG_BLOCK, &set, &j->oldmask) != 0 ||
        (j->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        return fprintf(stderr, "weftrun: signalfd: %s\n", strerror(errno)), 1;
    return 0;
}

static void job_free(struct job *j)
{
    for (int i = 0; j->streams && i < 2 * j->n; i++) {
        close_fd(j->streams[i].fd);
        free(j->streams[i].buf);
    }
    close_fd(j->sigfd);
    free(j->who);
    free(j->pfd);
    free(j->streams);
    free(j->reaped);
    free(j->pids);
}

int main(int argc, char **argv)
{
    static struct job job; /* static: the scratch buffer is large */
    struct opts o;
    /* A missing fd 0-2 would hand its number to a pipe or the listener. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return 1;
    int rc = opts_parse(argc, argv, &o), lfd = -1, slots = 0;
    if (rc != 0)
        goto out_opts;
    if (o.hostfile && (rc = hostfile_check(o.hostfile, &slots)) != 0)
        goto out_opts;
    if (o.nranks == 0)
        o.nranks = slots;
    if (o.nranks == 0) {
        rc = usage_error("-n is needed (or a --hostfile)%s", "");
        goto out_opts;
    }
    if ((rc = rendezvous_setup(&o, &lfd)) != 0)
        goto out_opts;
    if ((rc = job_init(&job, &o)) == 0) {
        if (job_spawn(&job, lfd) != 0)
            job_stop(&job, STOP_SPAWN, SIGTERM);
        close(lfd); /* rank 0 has its own copy now */
        lfd = -1;
        job_run(&job);
        rc = job_report(&job);
    }
    job_free(&job);
    close_fd(lfd);
out_opts:
    free(o.env);
    return rc < 0 ? 0 : rc;
}
