/*
 * corral-hook: the command an agent CLI runs before (and after) each tool call.
 *
 *   corral-hook SOCKET ATTEMPT TOKEN CLI [TIMEOUT_MS] < hook-payload.json
 *
 * It forwards the CLI's hook payload to the engine's governance socket and relays the decision:
 *
 *   request  = one header line {"op":"hook","attempt":…,"token":…,"cli":…,"deadline_ms":…} + the
 *              payload bytes, then end-of-file (shutdown of the write side). deadline_ms is when
 *              this hook gives up (CLOCK_MONOTONIC, shared by every process of the machine): an
 *              engine that reads the request later records the call as denied by the timeout.
 *   response = "<exit code>\n" + the bytes to print: on stdout for exit 0, on stderr for exit 2
 *
 * It fails closed: if the engine cannot be reached, does not answer within TIMEOUT_MS, or answers
 * something malformed, the hook exits 2 with a reason on stderr, which Claude Code and Codex both
 * treat as "block this tool call". Written in C so that a tool call costs a process start of
 * about a millisecond, not an interpreter's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAYLOAD (8 << 20)
#define MAX_REPLY (1 << 20)

static void deny(const char *fmt, ...) {
    va_list ap;
    fputs("corral: tool call denied: governance ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (fail-closed)\n", stderr);
    exit(2);
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Arguments go into a JSON header verbatim, so only a safe alphabet is accepted. */
static int plain(const char *s) {
    if (!*s || strlen(s) > 200)
        return 0;
    for (; *s; s++)
        if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '.'))
            return 0;
    return 1;
}

static int wait_for(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return 0;
    }
}

static void send_all(int fd, const char *buf, size_t len, long long deadline) {
    while (len > 0) {
        if (!wait_for(fd, POLLOUT, deadline))
            deny("timed out");
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            deny("connection failed: %s", strerror(errno));
        }
        buf += n;
        len -= (size_t)n;
    }
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: corral-hook SOCKET ATTEMPT TOKEN CLI [TIMEOUT_MS]\n");
        return 2;
    }
    const char *path = argv[1];
    long long timeout_ms = argc == 6 ? atoll(argv[5]) : 10000;
    if (timeout_ms <= 0)
        timeout_ms = 10000;
    long long deadline = now_ms() + timeout_ms;
    if (!plain(argv[2]) || !plain(argv[3]) || !plain(argv[4]))
        deny("hook was configured with malformed arguments");

    /* The payload: all of stdin. */
    char *payload = malloc(MAX_PAYLOAD);
    if (!payload)
        deny("out of memory");
    size_t have = 0;
    for (;;) {
        ssize_t n = read(0, payload + have, MAX_PAYLOAD - have);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            deny("could not read the hook payload: %s", strerror(errno));
        }
        have += (size_t)n;
        if (have == MAX_PAYLOAD)
            deny("payload larger than %d bytes", MAX_PAYLOAD);
    }

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        deny("socket path too long");
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        deny("socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno != EINPROGRESS && errno != EAGAIN)
            deny("unreachable at %s: %s", path, strerror(errno));
        if (!wait_for(fd, POLLOUT, deadline))
            deny("unreachable at %s: timed out", path);
    }

    char header[1024];
    int hl = snprintf(header, sizeof header,
                      "{\"op\":\"hook\",\"attempt\":\"%s\",\"token\":\"%s\",\"cli\":\"%s\","
                      "\"deadline_ms\":%lld}\n",
                      argv[2], argv[3], argv[4], deadline);
    send_all(fd, header, (size_t)hl, deadline);
    send_all(fd, payload, have, deadline);
    shutdown(fd, SHUT_WR);
    free(payload);

    char *reply = malloc(MAX_REPLY + 1);
    if (!reply)
        deny("out of memory");
    size_t got = 0;
    for (;;) {
        if (!wait_for(fd, POLLIN, deadline))
            deny("timed out after %lld ms", timeout_ms);
        ssize_t n = recv(fd, reply + got, MAX_REPLY - got, 0);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            deny("connection lost: %s", strerror(errno));
        }
        got += (size_t)n;
        if (got == MAX_REPLY)
            deny("reply too large");
    }
    close(fd);
    reply[got] = 0;

    char *body = memchr(reply, '\n', got);
    if (!body || (body - reply != 1) || (reply[0] != '0' && reply[0] != '2'))
        deny("answered something malformed");
    body++;
    size_t body_len = got - (size_t)(body - reply);
    int code = reply[0] - '0';
    FILE *out = code == 0 ? stdout : stderr;
    if (body_len && fwrite(body, 1, body_len, out) != body_len)
        deny("could not print the decision");
    if (fflush(out) != 0 && code == 0)
        deny("could not print the decision");
    return code;
}
