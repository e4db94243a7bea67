package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// CPU accounting per measured round (Linux /proc; elsewhere the columns
// stay empty): the server process's CPU (every thread's
// /proc/<pid>/task/<tid>/schedstat, nanoseconds) and the database's: on
// PostgreSQL the CPU of the server's backends, found by the
// application_name withParams gives each server's pool (a backend is one
// single-threaded process: its /proc/<pid>/schedstat); on a local MySQL or
// MariaDB the whole mysqld process's, background threads (purge, flushing)
// included, since one server is driven at a time. CPU time is what other
// load on a shared machine disturbs least, which makes it the number to
// compare before and after a change.

// procCPU returns the CPU time of every thread of pid, in nanoseconds.
func procCPU(pid int) (int64, bool) {
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum int64
	for _, t := range tasks {
		if ns, ok := schedstat(t); ok {
			sum += ns
		}
	}
	return sum, true
}

func schedstat(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f, _, _ := bytes.Cut(b, []byte(" "))
	ns, err := strconv.ParseInt(string(f), 10, 64)
	return ns, err == nil
}

// backendsCPU returns the CPU time, by backend pid, of the PostgreSQL
// backends whose application_name is app.
func backendsCPU(ctx context.Context, conn *pgx.Conn, app string) (map[int]int64, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(pids))
	for _, p := range pids {
		if ns, ok := schedstat("/proc/" + strconv.Itoa(int(p)) + "/schedstat"); ok {
			out[int(p)] = ns
		}
	}
	return out, nil
}

// cpuSnap is a server's CPU counters at one instant.
type cpuSnap struct {
	server   int64
	serverOK bool
	db       map[int]int64 // the database's, by pid; nil: not measured
}

func (w *roomWaiter) snap(ctx context.Context, s *server) cpuSnap {
	var c cpuSnap
	c.server, c.serverOK = procCPU(s.c.cmd.Process.Pid)
	switch {
	case w == nil:
	case w.conn != nil && s.app != "":
		c.db, _ = backendsCPU(ctx, w.conn, s.app)
	case w.dbPID > 0:
		if ns, ok := procCPU(w.dbPID); ok {
			c.db = map[int]int64{w.dbPID: ns}
		}
	}
	return c
}

// mysqldPID returns the pid of the MySQL or MariaDB server dsn names when
// it runs on this host (its pid file is readable and names a live
// process), else 0.
func mysqldPID(ctx context.Context, dsn string) int {
	db, _, err := openMySQL(dsn)
	if err != nil {
		return 0
	}
	defer db.Close()
	var file string
	if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&file); err != nil {
		return 0
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return 0
	}
	if _, ok := procCPU(pid); !ok {
		return 0
	}
	return pid
}

// cpuDelta is the CPU used between a and b: the server's, and its backends'
// (a backend that connected in between counts from zero; one that
// disconnected in between is lost, which the warm-up before every round
// makes rare).
func cpuDelta(a, b cpuSnap) (server, db int64, serverOK, dbOK bool) {
	if a.serverOK && b.serverOK {
		server, serverOK = b.server-a.server, true
	}
	if a.db != nil && b.db != nil {
		for pid, ns := range b.db {
			db += ns - a.db[pid]
		}
		dbOK = true
	}
	return server, db, serverOK, dbOK
}

// newBackends counts the backends in b that were not there in a.
func newBackends(a, b cpuSnap) int {
	n := 0
	for pid := range b.db {
		if _, ok := a.db[pid]; !ok && a.db != nil {
			n++
		}
	}
	return n
}
