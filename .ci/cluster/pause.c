/* The pod sandbox ("pause") process of the test cluster: registry.k8s.io/pause cannot be pulled here,
 * so .ci/install-k8s-node.sh compiles this statically. It sleeps, reaps zombies, and exits on TERM/INT. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
static void sigdown(int s) { (void)s; _exit(0); }
static void sigreap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0};
  a.sa_handler = sigdown; sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  a.sa_handler = sigreap; a.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &a, NULL);
  for (;;) pause();
}
