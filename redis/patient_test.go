package flightredis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replyError is an error reply of Redis, as go-redis passes one on.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestMigrating(t *testing.T) {
	for err, want := range map[error]bool{
		nil:                                    false,
		replyError("MOVED 3093 10.0.0.2:6379"): true,
		replyError("ASK 3093 10.0.0.2:6379"):   true,
		replyError("TRYAGAIN Multiple keys request during rehashing of slot"): true,
		fmt.Errorf("script: %w", replyError("TRYAGAIN x")):                    true,
		replyError("ERR unknown command"):                                     false,
		replyError("CLUSTERDOWN The cluster is down"):                         false,
		errors.New("MOVED 1 a:1"):                                             false, // not a reply of Redis
		redis.Nil:                                                             false,
		context.DeadlineExceeded:                                              false,
	} {
		if got := migrating(err); got != want {
			t.Errorf("migrating(%v) = %v, want %v", err, got, want)
		}
	}
}

// A script that meets a moving slot runs again until it gets another
// answer; one still moving when the command's context ends returns the
// last answer.
func TestPatientRunsAgainWhileTheSlotMoves(t *testing.T) {
	reply := func(err error) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		if err != nil {
			c.SetErr(err)
		} else {
			c.SetVal("ok")
		}
		return c
	}
	answers := []error{replyError("ASK 1 a:1"), replyError("TRYAGAIN x"), replyError("MOVED 1 a:1"), nil}
	runs := 0
	c := again(context.Background(), func() *redis.Cmd {
		runs++
		return reply(answers[runs-1])
	})
	if c.Err() != nil || c.Val() != "ok" || runs != 4 {
		t.Fatalf("after %d runs: %v, %v; want ok after 4", runs, c.Val(), c.Err())
	}

	runs = 0
	c = again(context.Background(), func() *redis.Cmd {
		runs++
		return reply(replyError("ERR boom"))
	})
	if runs != 1 || c.Err() == nil {
		t.Fatalf("another error: %d runs, %v; want 1, the error", runs, c.Err())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	runs = 0
	c = again(ctx, func() *redis.Cmd {
		runs++
		return reply(replyError("TRYAGAIN x"))
	})
	if !migrating(c.Err()) || runs < 2 || time.Since(start) > 5*time.Second {
		t.Fatalf("a slot moving past the deadline: %d runs in %v, %v; want TRYAGAIN after several", runs, time.Since(start), c.Err())
	}
}
