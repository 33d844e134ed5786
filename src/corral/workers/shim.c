/*
 * corral-shim: a tiny supervisor that sits between Corral's engine and one job process.
 *
 *   corral-shim [--cwd DIR] [--grace-ms N] [--deadline-ms EPOCH_MS] [--term-signal N]
 *               [--umask N] [--pump-arg WORD]... [--secrets-fd 4] [--cgroup DIR]
 *               <attempt_dir> -- <argv...>
 *
 * Why it exists: the engine must survive its own crash without losing running jobs or their
 * exit codes, and nothing a job starts may outlive it -- not even grandchildren that setsid().
 * The shim is a child subreaper, so every orphan below it is reparented to it and can be killed.
 *
 * Contract with the engine: we are started in a new session with stdin=/dev/null, stdout and
 * stderr on the attempt's log files, and fd 3 an flock()ed handle on <attempt_dir> itself.  We keep
 * fd 3 open until we exit, so "lock held" <=> "shim alive".  We write shim.pid, child.pid and, last
 * of all, result.json -- each atomically (tmp, fsync, rename) so a reader never sees half a file.
 *
 * Output: with --pump-arg, the job's stdout and stderr are pipes, never the log files.  When the
 * job first writes, we start the pump (workers/pump.py: the --pump-arg words) with the pipes at
 * fds 3 and 4, the logs at 1 and 2 and the secrets (--secrets-fd, a memfd) at 5; it writes the
 * logs redacted.  A job that writes nothing never costs a pump.  The pump is ours but not the
 * job's: tree kills spare it, and we write result.json only once it has written everything.  It
 * asks us (SIGUSR1) to stop the job when the output cap is reached; if it dies while the job
 * runs, we stop the job -- nothing may reach the logs unredacted.
 *
 * Cgroup: with --cgroup (a cgroup v2 directory the engine made for this attempt) we move
 * ourselves into it before anything else starts, so the job and all it starts stay in it -- the
 * engine can find and kill them there even if we die.  A failure to join is not fatal: the
 * engine still finds the attempt's processes by the marker in their environment.  A shim the
 * zygote forks is born in it (clone3 with CLONE_INTO_CGROUP) and never moves: a move waits for
 * the kernel's RCU grace period when none happened lately, ~10 ms on an idle machine, once as the
 * attempt starts and again as it ends.  At the end we stay in it too while whoever started us
 * waits (the core removes the cgroup once we are gone); an orphaned shim steps out and removes it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <sys/stat.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum reason { R_EXITED, R_TERMINATED, R_DEADLINE, R_SPAWN_ERROR, R_OUTPUT, R_LOST };
static const char *const reason_names[] = {"exited", "terminated", "deadline", "spawn_error",
                                           "output", "lost"};

struct proc { pid_t pid, ppid, pgid; char state, mine; };

/* One job per shim, so plain globals keep the helpers short. */
static pid_t self_pid, child_pid;
static int child_done, child_status;
static int childless; /* waitpid said ECHILD: no descendants can exist (we fork only once) */
static long long ended_at_ms;
static int sfd = -1;      /* signalfd: SIGCHLD/SIGTERM/SIGINT/SIGQUIT, all blocked */
static int dir_fd = -1;   /* the attempt dir; every file is written relative to it */
static struct proc *procs;                  /* scratch for the /proc walk, reused */
static size_t procs_cap;
static pid_t *killed;                       /* distinct descendants (not the job) we signalled */
static size_t nkilled, killed_cap;
static char **pump_argv;                    /* the pump's command line (NULL: no pump, no pipes) */
static size_t npump;
static int pipes[2] = {-1, -1};             /* read ends of the job's stdout and stderr */
static int secrets_fd = -1;
static pid_t pump_pid;
static int pump_done, pump_status, output_capped;
static int born_in_cgroup; /* the zygote forked us into the attempt's cgroup: no move needed */
/* our parent (the core, or its zygote): while it lives, the core removes our cgroup after us */
static pid_t born_ppid;

/* Move this process into the cgroup DIR (best effort; see the header). */
static void join_cgroup(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path)
        return;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (write(fd, "0", 1) < 0) {
        /* not allowed here (a container, no delegation): the marker remains */
    }
    close(fd);
}

/* Our job is over and its tree gone: step out of the attempt's cgroup DIR into its parent and
 * remove it, so that no empty cgroup outlives an attempt nobody waits for (an engine that died).
 * Best effort: the engine removes what is left. */
static void leave_cgroup(const char *dir)
{
    char parent[4096];
    if (snprintf(parent, sizeof parent, "%s", dir) >= (int)sizeof parent)
        return;
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent)
        return;
    strcpy(slash, "/cgroup.procs");
    int fd = open(parent, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t w = write(fd, "0", 1);
    close(fd);
    if (w == 1)
        rmdir(dir); /* EBUSY if anything is still in it: the engine sweeps it */
}

static long long clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what)
{
    fprintf(stderr, "corral-shim: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* tmp -> fsync -> rename (-> fsync dir): readers see the old state or the whole new file. */
static int write_atomic(const char *name, const char *data, size_t len, int durable)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, ".%s.tmp", name);
    int fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    for (size_t off = 0; off < len;) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno != EINTR) {
            close(fd);
            return -1;
        }
        off += n > 0 ? (size_t)n : 0;
    }
    /* Only the result must survive a power loss; pid files mean nothing after a reboot, so
     * they are renamed into place (atomic for readers) without paying for an fsync. */
    if (durable && fsync(fd) < 0) {
        close(fd);
        return -1;
    }
    if (close(fd) < 0 || renameat(dir_fd, tmp, dir_fd, name) < 0)
        return -1;
    return durable ? fsync(dir_fd) : 0;
}

static void write_pid_file(const char *name, pid_t pid)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%d\n", (int)pid);
    if (write_atomic(name, buf, (size_t)n, 0) < 0)
        die(name);
}

/* Reap every child that has exited: the job, and orphans the kernel handed to us. */
static void reap(void)
{
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) != 0) {
        if (p < 0) {
            if (errno == EINTR)
                continue;
            childless = errno == ECHILD;
            break;
        }
        if (p == child_pid && !child_done) {
            child_done = 1;
            child_status = st;
            ended_at_ms = clock_ms(CLOCK_REALTIME);
        } else if (p == pump_pid && !pump_done) {
            pump_done = 1;
            pump_status = st;
        }
    }
}

/* Drain the signalfd.  Reaps on SIGCHLD; returns a bitmask of the stop signals seen. */
#define SEEN_STOP 1   /* SIGTERM or SIGINT: stop politely */
#define SEEN_QUIT 2   /* SIGQUIT: kill now */
#define SEEN_OUTPUT 4 /* SIGUSR1 from the pump: the output cap is reached */
static int drain_signals(void)
{
    struct signalfd_siginfo si;
    int seen = 0;
    for (;;) {
        ssize_t n = read(sfd, &si, sizeof si);
        if (n != (ssize_t)sizeof si) {
            if (n < 0 && errno == EINTR)
                continue;
            return seen; /* EAGAIN: nothing more pending */
        }
        if (si.ssi_signo == SIGCHLD)
            reap();
        else if (si.ssi_signo == SIGUSR1) {
            if (pump_pid && (pid_t)si.ssi_pid == pump_pid) /* nobody else speaks for the pump */
                seen |= SEEN_OUTPUT, output_capped = 1;
        } else if (si.ssi_signo == SIGQUIT)
            seen |= SEEN_QUIT;
        else
            seen |= SEEN_STOP;
    }
}

static void start_pump(void);

/* Sleep until a signal is pending or timeout_ms passes (-1: no timeout).  Until the pump runs,
 * also watch the job's pipes: its first output starts the pump; a pipe closed unwritten is
 * dropped. */
static void wait_signals(long long timeout_ms)
{
    struct pollfd p[3] = {{.fd = sfd, .events = POLLIN}, {.fd = -1}, {.fd = -1}};
    for (int k = 0; k < 2; k++)
        p[k + 1] = (struct pollfd){.fd = pump_pid ? -1 : pipes[k], .events = POLLIN};
    int t = timeout_ms < 0 ? -1 : timeout_ms > 1000000000 ? 1000000000 : (int)timeout_ms;
    if (poll(p, 3, t) < 0) {
        if (errno != EINTR)
            die("poll");
        return;
    }
    for (int k = 0; k < 2; k++) {
        if (p[k + 1].revents & POLLIN) {
            start_pump();
            return;
        }
        if (p[k + 1].revents) { /* hung up (or an error) without a byte: nothing to pump */
            close(pipes[k]);
            pipes[k] = -1;
        }
    }
}

/* Fields 3-5 of /proc/<pid>/stat.  comm (field 2) may hold spaces and ')' so parse after the
 * LAST ')'.  Returns -1 if the process vanished meanwhile. */
static int read_stat(pid_t pid, struct proc *p)
{
    char path[48], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    int ppid, pgid;
    if (!rp || sscanf(rp + 1, " %c %d %d", &p->state, &ppid, &pgid) != 3)
        return -1;
    p->pid = pid, p->ppid = ppid, p->pgid = pgid, p->mine = 0;
    return 0;
}

static int by_pid(const void *a, const void *b)
{
    pid_t x = ((const struct proc *)a)->pid, y = ((const struct proc *)b)->pid;
    return (x > y) - (x < y);
}

/* Walk /proc and leave our live (non-zombie) descendants in procs[0..n).  Anything whose parent
 * chain reaches us counts, whatever session or process group it moved to. */
static size_t scan_descendants(void)
{
    /* Every live descendant hangs, through live ancestors, off one of our children (orphans are
     * reparented to us), so no children means no descendants: skip walking the whole host. */
    reap();
    if (childless)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        if (n == procs_cap) {
            size_t cap = procs_cap ? procs_cap * 2 : 256;
            struct proc *np = realloc(procs, cap * sizeof *np);
            if (!np)
                break; /* partial walk; the kill loop will come back */
            procs = np, procs_cap = cap;
        }
        if (read_stat((pid_t)pid, &procs[n]) == 0)
            n++;
    }
    closedir(d);
    qsort(procs, n, sizeof *procs, by_pid);
    /* Mark until stable: a process is ours if its parent is us or already marked. */
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t i = 0; i < n; i++) {
            if (procs[i].mine || (pump_pid && procs[i].pid == pump_pid))
                continue; /* the pump is ours, not the job's: it must outlive the tree */
            struct proc key = {.pid = procs[i].ppid};
            struct proc *parent = bsearch(&key, procs, n, sizeof *procs, by_pid);
            if (procs[i].ppid == self_pid || (parent && parent->mine))
                procs[i].mine = 1, changed = 1;
        }
    }
    size_t live = 0;
    for (size_t i = 0; i < n; i++)
        if (procs[i].mine && procs[i].state != 'Z' && procs[i].state != 'X')
            procs[live++] = procs[i];
    return live;
}

static void note_killed(pid_t pid)
{
    if (pid == child_pid)
        return;
    for (size_t i = 0; i < nkilled; i++)
        if (killed[i] == pid)
            return;
    if (nkilled == killed_cap) {
        size_t cap = killed_cap ? killed_cap * 2 : 64;
        pid_t *nk = realloc(killed, cap * sizeof *nk);
        if (!nk)
            return; /* only the count suffers */
        killed = nk, killed_cap = cap;
    }
    killed[nkilled++] = pid;
}

/* Send sig to the job's process group and to every descendant outside it (other groups or
 * sessions, which a group kill misses).  Returns how many live descendants there were. */
static size_t signal_tree(int sig)
{
    size_t n = scan_descendants();
    /* Once the job is reaped its pid may be reused, so only signal processes we just saw. */
    pid_t pgid = child_done ? 0 : child_pid;
    if (pgid)
        kill(-pgid, sig);
    for (size_t i = 0; i < n; i++) {
        note_killed(procs[i].pid);
        if (procs[i].pgid != pgid)
            kill(procs[i].pid, sig);
    }
    return n;
}

/* SIGKILL everything below us until nothing is left: a dying parent hands us new orphans and a
 * process may fork between our walk and our kill.  Bounded, so a process stuck in the kernel
 * (D state) cannot hang us forever; its SIGKILL stays pending and it dies when it wakes. */
static void kill_tree(void)
{
    long long give_up = clock_ms(CLOCK_MONOTONIC) + 10000;
    for (;;) {
        reap();
        if (signal_tree(SIGKILL) == 0 && child_done)
            break;
        if (clock_ms(CLOCK_MONOTONIC) >= give_up)
            break;
        wait_signals(10);
        drain_signals(); /* stop requests are moot now: we are already killing */
    }
    reap();
}

/* Descriptors we inherited beyond 0-3 (say, a pipe the engine's own parent reads until EOF) must
 * neither be pinned open for the job's whole life nor reach the job. */
static void close_stray_fds(int first)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)first, ~0U, 0U) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = first; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
        close((int)fd); /* old kernels only */
}

/* The job side of fork(): a clean slate, its own process group, then exec.  A failure is
 * reported through the CLOEXEC pipe (which closes silently on a successful exec). */
static void exec_child(char **argv, const char *cwd, int errpipe, const int *out, long umask_v)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int s = 1; s < NSIG; s++)
        sigaction(s, &dfl, NULL); /* fails harmlessly for KILL, STOP and libc-reserved ones */
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, NULL);
    setpgid(0, 0);
    if (umask_v >= 0)
        umask((mode_t)umask_v); /* the job's own, not the supervisor's private one */
    if (out[0] >= 0) /* dup2 clears CLOEXEC on 1 and 2; the pipes' other fds close at exec */
        dup2(out[0], 1), dup2(out[1], 2);
    int report[2] = {1, 0};
    if (cwd && chdir(cwd) < 0) {
        report[1] = errno;
    } else {
        execvp(argv[0], argv);
        report[0] = 2, report[1] = errno;
    }
    if (write(errpipe, report, sizeof report) < 0) {
        /* nothing we can do; the parent sees exit 127 without a reason */
    }
    _exit(127);
}

/* A descriptor at >= 10, close-on-exec, so the dup2s onto 3-5 in the pump cannot collide. */
static int high_fd(int fd)
{
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    if (h < 0)
        die("fcntl(F_DUPFD_CLOEXEC)");
    close(fd);
    return h;
}

static void start_pump(void)
{
    if (pump_pid || !pump_argv)
        return;
    pid_t pid = fork();
    if (pid < 0) { /* cannot pump: the job cannot be allowed to write; the main loop stops it */
        pump_done = 1, pump_status = 127 << 8;
        pump_pid = -1;
        return;
    }
    if (pid == 0) {
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        for (int s = 1; s < NSIG; s++)
            sigaction(s, &dfl, NULL);
        sigset_t empty;
        sigemptyset(&empty);
        sigprocmask(SIG_SETMASK, &empty, NULL);
        setpgid(0, 0); /* out of the job's group whatever happens to it */
        int src[3] = {pipes[0], pipes[1], secrets_fd};
        for (int k = 0; k < 3; k++) {
            int fd = src[k] >= 0 || k == 2 ? src[k] : open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && dup2(fd, 3 + k) < 0) /* a pipe closed unwritten reads as empty */
                _exit(127);
        }
        execvp(pump_argv[0], pump_argv);
        _exit(127);
    }
    pump_pid = pid;
    for (int k = 0; k < 2; k++) { /* the pump reads them now; the job must see EPIPE if it dies */
        if (pipes[k] >= 0)
            close(pipes[k]);
        pipes[k] = -1;
    }
}

/* The job's tree is gone: pump what it left in the pipes, then wait (bounded) for the pump to
 * write everything.  Returns 0 when the logs are complete. */
static int finish_output(void)
{
    for (int k = 0; k < 2 && !pump_pid; k++) {
        struct pollfd p = {.fd = pipes[k], .events = POLLIN};
        if (pipes[k] >= 0 && poll(&p, 1, 0) > 0 && (p.revents & POLLIN))
            start_pump();
    }
    for (int k = 0; k < 2; k++)
        if (pipes[k] >= 0)
            close(pipes[k]), pipes[k] = -1;
    if (pump_pid <= 0)
        return pump_pid < 0 ? -1 : 0;
    long long give_up = clock_ms(CLOCK_MONOTONIC) + 30000;
    while (!pump_done && clock_ms(CLOCK_MONOTONIC) < give_up) {
        wait_signals(100);
        drain_signals();
    }
    if (!pump_done) { /* a writer we could not kill still holds a pipe: stop waiting */
        kill(pump_pid, SIGKILL);
        while (waitpid(pump_pid, &pump_status, 0) < 0 && errno == EINTR)
            ;
        return -1;
    }
    return WIFEXITED(pump_status) && WEXITSTATUS(pump_status) == 0 ? 0 : -1;
}

static void json_escape(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
        else if (c < 0x20)
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        else
            out[o++] = (char)c;
    }
    out[o] = '\0';
}

static void write_result(enum reason reason, long long started_at_ms, const char *error)
{
    char exit_s[16] = "null", sig_s[16] = "null", err_s[300] = "null", esc[256];
    if (child_done && WIFEXITED(child_status))
        snprintf(exit_s, sizeof exit_s, "%d", WEXITSTATUS(child_status));
    else if (child_done && WIFSIGNALED(child_status))
        snprintf(sig_s, sizeof sig_s, "%d", WTERMSIG(child_status));
    if (error) {
        json_escape(esc, sizeof esc, error);
        snprintf(err_s, sizeof err_s, "\"%s\"", esc);
    }
    char buf[768];
    int n = snprintf(buf, sizeof buf,
                     "{\"exit_code\": %s, \"signal\": %s, \"reason\": \"%s\", "
                     "\"started_at_ms\": %lld, \"ended_at_ms\": %lld, \"child_pid\": %d, "
                     "\"descendants_killed\": %zu, \"error\": %s}\n",
                     exit_s, sig_s, reason_names[reason], started_at_ms, ended_at_ms,
                     (int)child_pid, nkilled, err_s);
    if (write_atomic("result.json", buf, (size_t)n, 1) < 0)
        die("result.json");
}

static long long parse_num(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > (1LL << 50)) {
        fprintf(stderr, "corral-shim: bad %s: %s\n", what, s);
        exit(2);
    }
    return v;
}

static int shim_main(int argc, char **argv)
{
    const char *cwd = NULL, *cgroup = NULL;
    long long grace_ms = 10000, deadline_ms = 0, term_sig = SIGTERM, child_only = 0;
    long umask_v = -1;
    pump_argv = calloc((size_t)argc + 1, sizeof *pump_argv);
    if (!pump_argv)
        die("calloc");
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0 && argv[i][2]; i += 2) {
        if (!strcmp(argv[i], "--cwd"))
            cwd = argv[i + 1];
        else if (!strcmp(argv[i], "--grace-ms"))
            grace_ms = parse_num(argv[i + 1], "grace");
        else if (!strcmp(argv[i], "--deadline-ms"))
            deadline_ms = parse_num(argv[i + 1], "deadline");
        else if (!strcmp(argv[i], "--term-signal"))
            term_sig = parse_num(argv[i + 1], "signal");
        else if (!strcmp(argv[i], "--term-child-only")) /* the job stops its own tree politely */
            child_only = parse_num(argv[i + 1], "term-child-only");
        else if (!strcmp(argv[i], "--umask"))
            umask_v = (long)parse_num(argv[i + 1], "umask") & 0777;
        else if (!strcmp(argv[i], "--pump-arg"))
            pump_argv[npump++] = argv[i + 1];
        else if (!strcmp(argv[i], "--secrets-fd"))
            secrets_fd = (int)parse_num(argv[i + 1], "secrets-fd");
        else if (!strcmp(argv[i], "--cgroup"))
            cgroup = argv[i + 1];
        else
            break;
    }
    if (i + 2 >= argc || strcmp(argv[i + 1], "--") != 0 || term_sig < 1 || term_sig >= NSIG) {
        fprintf(stderr, "usage: corral-shim [--cwd DIR] [--grace-ms N] [--deadline-ms EPOCH_MS]"
                        " [--term-signal N] [--term-child-only 0|1] [--umask N] [--pump-arg W]..."
                        " [--secrets-fd 4] [--cgroup DIR] <attempt_dir> -- <argv...>\n");
        return 2;
    }
    if (!npump) {
        free(pump_argv);
        pump_argv = NULL;
    }
    char **job_argv = &argv[i + 2];
    self_pid = getpid();
    if (!born_ppid) /* a zygote's shim has its zygote's pid already: it may be gone by now */
        born_ppid = getppid();
    if (cgroup && !born_in_cgroup)
        join_cgroup(cgroup); /* before the job, the pump or anything else is forked */

    /* fd 4 (the secrets) only when announced, and then for the pump alone */
    if (secrets_fd == 4 && pump_argv && fcntl(4, F_GETFD) >= 0) {
        close_stray_fds(5);
        secrets_fd = high_fd(4);
    } else {
        secrets_fd = -1;
        close_stray_fds(4);
    }
    /* fd 3 holds the attempt lock for our whole life; the job must not inherit it, or a stray
     * grandchild would make a dead shim look alive. */
    int fl = fcntl(3, F_GETFD);
    if (fl >= 0)
        fcntl(3, F_SETFD, fl | FD_CLOEXEC);
    /* Signals arrive through a signalfd only; no async handlers.  The engine may already have
     * blocked them at spawn time so that an early SIGTERM is queued rather than fatal.  SIGCHLD
     * must not be SIG_IGN (inherited through exec) or the kernel would reap for us. */
    sigset_t mask;
    sigemptyset(&mask);
    int handled[] = {SIGCHLD, SIGTERM, SIGINT, SIGQUIT, SIGUSR1};
    for (size_t k = 0; k < sizeof handled / sizeof *handled; k++)
        sigaddset(&mask, handled[k]);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    for (size_t k = 0; k < sizeof handled / sizeof *handled; k++)
        signal(handled[k], SIG_DFL);
    signal(SIGHUP, SIG_IGN);  /* the engine's session may go away; we must not */
    signal(SIGPIPE, SIG_IGN); /* a closed log reader must not kill the supervisor */
    if ((sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        die("signalfd");
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        die("prctl(PR_SET_CHILD_SUBREAPER)");
    if ((dir_fd = open(argv[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        die(argv[i]);
    write_pid_file("shim.pid", self_pid);

    int errpipe[2], out_w[2] = {-1, -1};
    if (pipe2(errpipe, O_CLOEXEC) < 0)
        die("pipe2");
    for (int k = 0; k < 2 && pump_argv; k++) {
        int pp[2];
        if (pipe2(pp, O_CLOEXEC) < 0)
            die("pipe2");
        pipes[k] = high_fd(pp[0]);
        out_w[k] = high_fd(pp[1]);
    }
    enum reason reason = R_EXITED;
    char error[160] = "";
    long long started_at_ms = clock_ms(CLOCK_REALTIME);
    child_pid = fork();
    if (child_pid == 0)
        exec_child(job_argv, cwd, errpipe[1], out_w, umask_v);
    close(errpipe[1]);
    for (int k = 0; k < 2; k++) /* the job (and what it starts) holds the only write ends */
        if (out_w[k] >= 0)
            close(out_w[k]);
    if (child_pid < 0) {
        snprintf(error, sizeof error, "fork: %s", strerror(errno));
        child_pid = 0;
        ended_at_ms = clock_ms(CLOCK_REALTIME);
        write_result(R_SPAWN_ERROR, started_at_ms, error);
        return 0;
    }
    setpgid(child_pid, child_pid); /* also here: we may signal -child_pid before the child runs */
    write_pid_file("child.pid", child_pid);

    int report[2];
    ssize_t got;
    while ((got = read(errpipe[0], report, sizeof report)) < 0 && errno == EINTR)
        ;
    close(errpipe[0]);
    if (got == (ssize_t)sizeof report) {
        reason = R_SPAWN_ERROR;
        snprintf(error, sizeof error, "%s: %s", report[0] == 1 ? "chdir" : "exec",
                 strerror(report[1]));
        /* The child is already in _exit(127); SIGCHLD is blocked, so no EINTR either. */
        while (waitpid(child_pid, &child_status, 0) < 0 && errno == EINTR)
            ;
        child_done = 1;
        ended_at_ms = clock_ms(CLOCK_REALTIME);
    }

    /* Main loop: wait for the job, honouring stop requests, the grace timer and the deadline. */
    int stopping = 0;
    long long kill_at = 0; /* CLOCK_MONOTONIC ms at which the grace ends */
    while (!child_done) {
        long long now = clock_ms(CLOCK_MONOTONIC), timeout = -1; /* -1: only signals matter */
        if (stopping) {
            timeout = kill_at > now ? kill_at - now : 0;
        } else if (deadline_ms) { /* the wall clock may jump: re-check at least every 10 s */
            long long left = deadline_ms - clock_ms(CLOCK_REALTIME);
            timeout = left < 0 ? 0 : left < 10000 ? left : 10000;
        }
        wait_signals(timeout);
        int seen = drain_signals();
        if (child_done)
            break;
        now = clock_ms(CLOCK_MONOTONIC);
        int deadline_hit = deadline_ms && clock_ms(CLOCK_REALTIME) >= deadline_ms;
        if (pump_done && !stopping && !(WIFEXITED(pump_status) && !WEXITSTATUS(pump_status))) {
            /* the pump died: nothing the job writes could be redacted now */
            stopping = 1;
            reason = R_LOST;
            kill_at = now;
            snprintf(error, sizeof error, "the output pump ended while the job ran (status %d): "
                     "job stopped, its output cannot be kept", pump_status);
        }
        if (!stopping && (seen || deadline_hit)) {
            stopping = 1;
            reason = seen & (SEEN_STOP | SEEN_QUIT) ? R_TERMINATED
                     : seen & SEEN_OUTPUT           ? R_OUTPUT
                                                    : R_DEADLINE;
            kill_at = now + grace_ms;
            if (!(seen & SEEN_QUIT)) {
                if (child_only)
                    kill(child_pid, (int)term_sig); /* the rest dies at the end of the grace */
                else
                    signal_tree((int)term_sig);
            }
        }
        if (seen & SEEN_QUIT) /* a second SIGTERM/SIGINT is ignored: the grace keeps running */
            kill_at = now;
        if (stopping && now >= kill_at)
            kill_tree();
    }

    /* The job is gone; whatever it left behind must not outlive us.  A job that ended on its own
     * gets its leftovers a short polite SIGTERM first; a stopped job's leftovers die at once. */
    if (reason == R_EXITED && signal_tree(SIGTERM) > 0) {
        long long until = clock_ms(CLOCK_MONOTONIC) + (grace_ms < 2000 ? grace_ms : 2000);
        for (long long now; (now = clock_ms(CLOCK_MONOTONIC)) < until;) {
            wait_signals(until - now < 50 ? until - now : 50); /* grandchildren send us no SIGCHLD */
            if (drain_signals() || scan_descendants() == 0)
                break;
        }
    }
    kill_tree();
    if (!child_done) /* stuck in the kernel past kill_tree's patience: report what we know */
        ended_at_ms = clock_ms(CLOCK_REALTIME);
    if (finish_output() < 0 && reason == R_EXITED) {
        /* the job ended by itself (maybe of the broken pipe), but its output was not kept */
        reason = R_LOST;
        snprintf(error, sizeof error, "the output pump ended while the job ran (status %d): "
                 "its output cannot be kept", pump_status);
    } else if (pump_done && pump_status && !error[0]) {
        snprintf(error, sizeof error, "the output pump failed (status %d): the logs may be "
                 "incomplete", pump_status);
    }
    if (output_capped && reason == R_EXITED) /* it ended by itself, but not all of it was kept */
        reason = R_OUTPUT;
    if (cgroup && getppid() != born_ppid) /* orphaned: nobody removes the cgroup after us */
        leave_cgroup(cgroup); /* before the result: a reader finds the cgroup gone or in use */
    write_result(reason, started_at_ms, error[0] ? error : NULL);
    free(procs);
    free(killed);
    return 0;
}

/* ---------------------------------------------------------------------------------- zygote
 *
 *   corral-shim --zygote FD
 *
 * Why: starting a shim costs an exec (a fresh process image, the dynamic loader) on top of the
 * job's own, about as much CPU as the job's exec itself (bench/ W1).  The core instead keeps one
 * zygote: this binary, waiting on FD (a SOCK_SEQPACKET socket) for requests, each a shim's
 * command line and environment with its descriptors (stdout, stderr, the attempt lock, and the
 * secrets when there are any) passed along.  It forks, and the child runs exactly what an
 * exec'd shim runs (shim_main) in a new session: the attempt's supervision is the same code
 * with the same guarantees, minus the exec.
 *
 * Request: two uint32 (argc, envc), then argc + envc NUL-terminated strings; SCM_RIGHTS with
 * 3 or 4 descriptors, placed at 1, 2, 3 (and 4) in the child, /dev/null at 0.
 * Reply: two int32 (pid, errno: pid < 0 when the fork failed); with a pid, a pidfd of the
 * child (SCM_RIGHTS) opened before the child could be reaped, so it names that child only.
 *
 * The zygote reaps its children and holds nothing of theirs: killing it leaves every shim
 * running (reparented), and the core starts another.  It exits when the core closes FD. */

#define ZYGOTE_MAX_FDS 4

/* The request's strings as argv and environ (each NULL-terminated, in one array), or NULL when
 * the request is malformed. */
static char **zygote_parse(char *buf, size_t len, uint32_t *argc)
{
    uint32_t counts[2];
    if (len < sizeof counts)
        return NULL;
    memcpy(counts, buf, sizeof counts);
    size_t total = (size_t)counts[0] + counts[1];
    if (counts[0] < 1 || total > len)
        return NULL;
    char **strs = calloc(total + 2, sizeof *strs); /* argv's NULL, then environ's */
    if (!strs)
        return NULL;
    char *p = buf + sizeof counts, *end = buf + len;
    for (size_t k = 0, slot = 0; k < total; k++, slot++) {
        char *nul = p < end ? memchr(p, '\0', (size_t)(end - p)) : NULL;
        if (!nul) {
            free(strs);
            return NULL;
        }
        if (k == counts[0])
            slot++; /* argv's terminating NULL */
        strs[slot] = p;
        p = nul + 1;
    }
    *argc = counts[0];
    return strs;
}

static void zygote_child(char **strs, uint32_t argc, const int *fds, int nfds)
{
    if (setsid() < 0)
        _exit(2);
    int high[ZYGOTE_MAX_FDS];
    for (int k = 0; k < nfds; k++) /* above 0-4 first, so the dup2s below cannot collide */
        if ((high[k] = fcntl(fds[k], F_DUPFD_CLOEXEC, 10)) < 0)
            _exit(2);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0)
        _exit(2);
    for (int k = 0; k < nfds; k++)
        if (dup2(high[k], k + 1) < 0)
            _exit(2);
    extern char **environ;
    environ = &strs[argc + 1];
    /* shim_main closes every other descriptor (the zygote's socket and signalfd included) */
    exit(shim_main((int)argc, strs));
}

static int zygote_reply(int sock, pid_t pid, int err, int pidfd)
{
    int32_t body[2] = {(int32_t)pid, (int32_t)err};
    struct iovec iov = {.iov_base = body, .iov_len = sizeof body};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pidfd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pidfd, sizeof(int));
    }
    return sendmsg(sock, &msg, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

/* The --cgroup of a shim's command line (its options come in pairs before the attempt dir). */
static const char *shim_cgroup(char **argv, uint32_t argc)
{
    for (uint32_t i = 1; i + 1 < argc && strncmp(argv[i], "--", 2) == 0 && argv[i][2]; i += 2)
        if (!strcmp(argv[i], "--cgroup"))
            return argv[i + 1];
    return NULL;
}

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif

/* The kernel's struct clone_args up to `cgroup` (CLONE_ARGS_SIZE_VER2). */
struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    uint64_t set_tid, set_tid_size, cgroup;
};

/* fork(), but born in the shim's cgroup when it has one and the kernel can (5.7+): a move
 * after the fork is what the shim would otherwise pay (see the header).  The child runs on
 * without glibc's fork bookkeeping, which a single-threaded zygote does not need. */
static pid_t zygote_fork(char **argv, uint32_t argc)
{
    born_ppid = getpid(); /* the child's parent, whether it lives when the child looks or not */
    const char *cgroup = shim_cgroup(argv, argc);
    int cfd = cgroup ? open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (cfd >= 0) {
        struct clone_args_v2 args = {
            .flags = CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)cfd};
        long pid = syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0) {
            born_in_cgroup = 1;
            return 0;
        }
        close(cfd);
        if (pid > 0)
            return (pid_t)pid;
        /* ENOSYS, E2BIG (older kernel), EOPNOTSUPP or EBUSY (not a usable cgroup): fork, and
         * the shim joins it itself */
    }
    return fork();
}

/* One request: 1 when served (or refused with a reply), 0 at EOF, -1 on a socket error. */
static int zygote_serve_one(int sock)
{
    /* The size first (MSG_PEEK | MSG_TRUNC), so any request the socket could carry fits. */
    char probe[8];
    ssize_t size = recv(sock, probe, sizeof probe, MSG_PEEK | MSG_TRUNC);
    if (size <= 0)
        return size == 0 ? 0 : errno == EINTR || errno == EAGAIN ? 1 : -1;
    char *buf = malloc((size_t)size + 1);
    if (!buf)
        return -1;
    union { char buf[CMSG_SPACE(ZYGOTE_MAX_FDS * sizeof(int))]; struct cmsghdr align; } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = (size_t)size};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
        free(buf);
        return n == 0 ? 0 : -1;
    }
    buf[n] = '\0';
    int fds[ZYGOTE_MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int k = 0; k < got; k++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
            if (nfds < ZYGOTE_MAX_FDS)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    uint32_t argc = 0;
    char **strs = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && nfds >= 3
                      ? zygote_parse(buf, (size_t)n, &argc)
                      : NULL;
    pid_t pid = strs ? zygote_fork(strs, argc) : -1;
    if (pid == 0)
        zygote_child(strs, argc, fds, nfds); /* never returns */
    int err = strs ? errno : EINVAL, pidfd = -1;
    free(strs);
    if (pid > 0) {
        pidfd = (int)syscall(SYS_pidfd_open, pid, 0); /* -1 on old kernels: the core polls */
        err = 0;
    }
    for (int k = 0; k < nfds; k++)
        close(fds[k]); /* the child holds its copies (and so the attempt lock) now */
    free(buf);
    int sent = zygote_reply(sock, pid > 0 ? pid : -1, err, pidfd);
    if (pidfd >= 0)
        close(pidfd);
    return sent < 0 ? -1 : 1;
}

static int zygote(int sock)
{
    /* Blocked for good: the mask every child starts with (an early stop request to a shim is
     * queued for its signalfd, as the core's spawn does), and how we learn of our own. */
    sigset_t mask;
    sigemptyset(&mask);
    int blocked[] = {SIGCHLD, SIGTERM, SIGINT, SIGQUIT};
    for (size_t k = 0; k < sizeof blocked / sizeof *blocked; k++)
        sigaddset(&mask, blocked[k]);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGHUP, SIG_IGN);
    int zfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (zfd < 0)
        die("signalfd");
    for (;;) {
        struct pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = zfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            int stop = 0;
            while (read(zfd, &si, sizeof si) == (ssize_t)sizeof si)
                stop |= si.ssi_signo != SIGCHLD;
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
            if (stop)
                return 0; /* our shims run on without us */
        }
        if (p[0].revents) {
            int served = zygote_serve_one(sock);
            if (served <= 0)
                return served == 0 ? 0 : 1;
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--zygote"))
        return zygote((int)parse_num(argv[2], "zygote fd"));
    return shim_main(argc, argv);
}
