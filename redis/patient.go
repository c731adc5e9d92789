package flightredis

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// patient runs the tier's scripts through its client, and runs one again
// when a Cluster answered that the hash slot of its keys is moving (MOVED,
// ASK or TRYAGAIN) after the client spent its own redirects: a hash slot of
// thousands of keys can take longer to migrate than a client's
// MaxRedirects last, and its keys, half moved, answer TRYAGAIN
// throughout. Such an answer means the script did not run, so running it
// again is safe. It goes on until the command's context ends (the tier's
// Timeout): only then is the failure the tier's, which steps it aside.
type patient struct {
	redis.Scripter
}

// migrationBackoff is the wait between two runs of a script that met a
// moving hash slot, before jitter.
const migrationBackoff = 20 * time.Millisecond

// EvalSha runs a script by its hash (redis.Script.Run tries it first).
func (p patient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return again(ctx, func() *redis.Cmd { return p.Scripter.EvalSha(ctx, sha, keys, args...) })
}

// Eval runs a script by its source (redis.Script.Run falls back to it on
// NOSCRIPT).
func (p patient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return again(ctx, func() *redis.Cmd { return p.Scripter.Eval(ctx, script, keys, args...) })
}

// again runs cmd until its answer is not a moving hash slot's, or ctx ends
// (then the last answer stands).
func again(ctx context.Context, cmd func() *redis.Cmd) *redis.Cmd {
	for {
		c := cmd()
		if !migrating(c.Err()) {
			return c
		}
		timer := time.NewTimer(jitter(migrationBackoff))
		select {
		case <-ctx.Done():
			timer.Stop()
			return c
		case <-timer.C:
		}
	}
}

// migrating reports whether err is a Cluster's answer for a hash slot that is
// moving or has moved: the command did not run.
func migrating(err error) bool {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	s := re.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "TRYAGAIN")
}
