// Command changelag measures how long a committed row change takes to
// reach a flightpg Source's target, and what reading the stream costs.
//
//	go run ./cmd/changelag -url "$PG_URL" -n 10000 -rate 1000
//
// It makes a table of -n rows and a publication of it, starts a Source
// (on a temporary slot) whose target records when each key is
// invalidated, then commits -n single-row UPDATEs, one per row, paced at
// -rate a second on one plain pgx connection (an outside writer), and
// waits until every one is applied. It prints, over the -n updates, the
// time from each commit's return to its key's invalidation (p50, p99,
// max), the rate achieved, this process's CPU (the writer's included) and
// the walsender's (read from /proc, when the server runs on this
// machine), each per 1,000 changes. It drops the table and the
// publication when done.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"time"

	flightpg "github.com/flightcache/flightcache/postgres"
	"github.com/flightcache/flightcache/postgres/internal/cputime"
	"github.com/jackc/pgx/v5"
)

// stamps is the target: when each key (row id) was invalidated. Only the
// Source's goroutine writes it; it is read after Wait.
type stamps struct{ at []time.Time }

func (s *stamps) Invalidate(id int64) {
	if id > 0 && id < int64(len(s.at)) && s.at[id].IsZero() {
		s.at[id] = time.Now()
	}
}
func (s *stamps) InvalidateAll() {}

func main() {
	url := flag.String("url", os.Getenv("PG_URL"), "the server (default $PG_URL); the user needs REPLICATION")
	n := flag.Int("n", 10000, "updates (and rows)")
	rate := flag.Int("rate", 1000, "updates a second")
	flag.Parse()
	if *url == "" || *n <= 0 || *rate <= 0 {
		log.Fatal("changelag: need -url (or $PG_URL), -n > 0 and -rate > 0")
	}
	if err := run(*url, *n, *rate); err != nil {
		log.Fatal(err)
	}
}

func run(url string, n, rate int) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	table, pub := "changelag_"+suffix, "changelag_pub_"+suffix
	for _, sql := range []string{
		"CREATE TABLE " + table + " (id int8 PRIMARY KEY, price int4)",
		"INSERT INTO " + table + " SELECT g, 0 FROM generate_series(1, " + strconv.Itoa(n) + ") g",
		"CREATE PUBLICATION " + pub + " FOR TABLE " + table,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	defer func() {
		_, _ = conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pub)
		_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
	}()

	target := &stamps{at: make([]time.Time, n+1)}
	byID := func(c flightpg.Change) ([]int64, []string) {
		id, _ := c.New["id"].(int64)
		return []int64{id}, nil
	}
	src, err := flightpg.New(ctx, url, target, byID, flightpg.Options{Publication: pub})
	if err != nil {
		return err
	}
	defer src.Close()
	var walsender int
	_ = conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", src.Slot()).Scan(&walsender)

	committed := make([]time.Time, n+1)
	cpu0, ws0 := cputime.Self(), cputime.Of(walsender)
	began := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for id := 1; id <= n; id++ {
		<-tick.C
		if _, err := conn.Exec(ctx, "UPDATE "+table+" SET price = price + 1 WHERE id = $1", id); err != nil {
			return err
		}
		committed[id] = time.Now()
	}
	wrote := time.Since(began)
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	at, err := flightpg.ParseLSN(lsn)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := src.Wait(wctx, at); err != nil {
		return fmt.Errorf("wait for the last update: %w", err)
	}
	cpu, ws := cputime.Self()-cpu0, cputime.Of(walsender)-ws0

	lags := make([]time.Duration, 0, n)
	for id := 1; id <= n; id++ {
		if target.at[id].IsZero() {
			return fmt.Errorf("row %d: its update was never applied", id)
		}
		lags = append(lags, max(0, target.at[id].Sub(committed[id])))
	}
	slices.Sort(lags)
	st := src.Stats()
	per := func(d time.Duration) string {
		return (d * 1000 / time.Duration(n)).Round(time.Microsecond).String()
	}
	fmt.Printf("%d updates at %.0f/s (asked %d/s): commit returned -> invalidated p50 %v p99 %v max %v\n",
		n, float64(n)/wrote.Seconds(), rate, lags[n/2], lags[n*99/100], lags[n-1])
	fmt.Printf("Source: %d transactions, %d not yet visible on arrival, lag (commit -> applied, last %d) p50 %v p99 %v\n",
		st.Transactions, st.NotYetVisible, st.Lag.Samples, st.Lag.P50, st.Lag.P99)
	fmt.Printf("CPU per 1,000 changes: this process %s (the writer's included)", per(cpu))
	if walsender != 0 && ws >= 0 {
		fmt.Printf(", the walsender %s", per(ws))
	}
	fmt.Println()
	return nil
}
