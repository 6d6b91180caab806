// A command-line parse error that names the option: cxxopts reports a value it cannot convert as
// "Argument 'VALUE' failed to parse" without saying which option it was given to.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <initializer_list>
#include <string>
#include <vector>

namespace hy {

// A real-number option's value, strictly (cxxopts' float parser stops at the first bad character and keeps the
// number before it): the whole text must be a finite decimal number such as "0.5", "-1", ".5", "2." or "1e-3";
// "0.5abc", "1,5", "0x10", "nan", "inf" and "" give false.
inline bool parse_real(const std::string& text, double* out) {
    if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) return false;
    *out = v;
    return true;
}

// The message for a cxxopts parse error `what`: when it quotes a value that follows an option on the command
// line (argv[1..argc-1]: "-c VALUE", "--ctx-size VALUE", "--ctx-size=VALUE" or "-cVALUE"), "invalid value 'VALUE'
// for OPTION" (with " (out of range)" when VALUE is an integer); a missing value "-p needs a value"; an unknown option
// "unknown option -x"; otherwise `what` with ASCII quotes.
inline std::string parse_error_message(const char* what, int argc, char** argv) {
    const std::string msg = what;
    // cxxopts quotes with U+2018 / U+2019 (UTF-8 E2 80 98 / E2 80 99)
    const std::string open = "\xE2\x80\x98", close = "\xE2\x80\x99";
    const size_t a = msg.find(open);
    const size_t b = a == std::string::npos ? a : msg.find(close, a + open.size());
    if (a == std::string::npos || b == std::string::npos) return msg;
    if (msg.find("does not exist") != std::string::npos) {  // "Option 't' does not exist": as hybrid words it
        const std::string name = msg.substr(a + open.size(), b - a - open.size());
        return "unknown option " + std::string(name.size() == 1 ? "-" : "--") + name;
    }
    if (msg.find("is missing an argument") != std::string::npos) {  // "Option 'p' is missing an argument"
        const std::string name = msg.substr(a + open.size(), b - a - open.size());
        return (name.size() == 1 ? "-" : "--") + name + " needs a value";
    }
    if (msg.find("failed to parse") == std::string::npos)  // other cxxopts messages: ASCII quotes, as ours
        return msg.substr(0, a) + "'" + msg.substr(a + open.size(), b - a - open.size()) + "'" +
               msg.substr(b + close.size());
    const std::string value = msg.substr(a + open.size(), b - a - open.size());
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        std::string option;
        if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos && arg.substr(arg.find('=') + 1) == value)
            option = arg.substr(0, arg.find('='));
        else if (arg == value && i > 1 && argv[i - 1][0] == '-' && std::strlen(argv[i - 1]) > 1)
            option = argv[i - 1];
        else if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-' && arg.substr(2) == value)
            option = arg.substr(0, 2);
        if (!option.empty()) {
            // an integer cxxopts could not parse is past its option's type ("-n 99999999999999999999")
            const size_t d = value.rfind('-', 0) == 0 ? 1 : 0;
            const bool integer = value.size() > d && value.find_first_not_of("0123456789", d) == std::string::npos;
            // a real number cxxopts could not parse was given to an int option ("-n 2.5"); other text is no number
            // for any option type ("-n abc", "--temp hot")
            double real = 0;
            const bool is_real = !integer && parse_real(value, &real);
            return "invalid value '" + value + "' for " + option +
                   (integer   ? " (out of range)"
                    : is_real ? " (a decimal integer)"
                              : " (not a number)");
        }
    }
    return msg;
}

// True when text is a whole decimal real number in strtod's syntax that parse_real refuses only for its range
// (overflow past double, or underflow such as 1e-400).
inline bool decimal_real_out_of_range(const std::string& text) {
    if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
    char* end = nullptr;
    errno = 0;
    (void)std::strtod(text.c_str(), &end);
    return end == text.c_str() + text.size() && errno == ERANGE;
}

// The message for a real-number option's value that parse_real refused: "invalid value 'TEXT' for --NAME (out of
// range)" for a decimal number past double's range, else "... (a decimal number)" (what the value should be).
inline std::string invalid_real_message(const std::string& text, const std::string& name) {
    return "invalid value '" + text + "' for --" + name +
           (decimal_real_out_of_range(text) ? " (out of range)" : " (a decimal number)");
}

// Digits with an optional '-' first, of any length ("+4", "0x10", "" are not).
inline bool decimal_int_text(const std::string& text) {
    const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
    return text.size() > sign && text.find_first_not_of("0123456789", sign) == std::string::npos;
}

// An int option's value, strictly (cxxopts wraps some values past 2^32, e.g. "5000000000" became 705032704, and
// takes hexadecimal): the whole text must be a decimal integer in the range of int, an optional '-' first (leading
// zeros allowed: "0005" is 5).
inline bool parse_int(const std::string& text, int* out) {
    if (!decimal_int_text(text)) return false;
    const size_t first = text.find_first_not_of('0', text[0] == '-' ? 1 : 0);  // (npos: the value 0)
    if (first != std::string::npos && text.size() - first > 10) return false;
    const long long v = std::strtoll(text.c_str(), nullptr, 10);
    if (v < -2147483648LL || v > 2147483647LL) return false;
    *out = int(v);
    return true;
}

// The first of the int options `names` (long names) given a value parse_int refuses, as the message "invalid value
// 'VALUE' for --NAME (...)"; empty when every one is fine.
inline std::string bad_int_arg(const cxxopts::ParseResult& r, std::initializer_list<const char*> names) {
    int v = 0;
    for (const auto& kv : r.arguments())
        for (const char* n : names)
            if (kv.key() == n && !parse_int(kv.value(), &v)) {
                // (digits past the int range, or not a decimal integer at all; the option's own range is checked
                // after this, so it is not the int range that is named)
                return "invalid value '" + kv.value() + "' for --" + n +
                       (decimal_int_text(kv.value()) ? " (out of range)" : " (a decimal integer)");
            }
    return "";
}

// The first of the real-number options `names` (long names) given a value parse_real refuses ("0x5", "1,5",
// "nan"), as the message "invalid value 'VALUE' for --NAME (a decimal number)"; empty when every one is fine.
inline std::string bad_real_arg(const cxxopts::ParseResult& r, std::initializer_list<const char*> names) {
    double v = 0.0;
    for (const auto& kv : r.arguments())
        for (const char* n : names)
            if (kv.key() == n && !parse_real(kv.value(), &v))
                return "invalid value '" + kv.value() + "' for --" + n + " (a decimal number)";
    return "";
}

// "--NAME was given more than once (give it once)" for the first option given twice, or empty: each takes one value,
// and cxxopts would keep the last without a word (every program refuses a repeated option the same way).
inline std::string repeated_option(const cxxopts::ParseResult& r) {
    std::vector<std::string> seen;
    for (const cxxopts::KeyValue& kv : r.arguments()) {
        if (std::find(seen.begin(), seen.end(), kv.key()) != seen.end())
            return "--" + kv.key() + " was given more than once (give it once)";
        seen.push_back(kv.key());
    }
    return "";
}

// A comma-separated list of integers in [lo, hi] ("1,2,3"; spaces around an item are allowed) into out. Returns
// false with *bad set to the first item that is not one (an empty item included; only digits, no sign).
inline bool parse_int_list(const std::string& s, long long lo, long long hi, std::vector<int32_t>& out,
                           std::string* bad) {
    out.clear();
    for (size_t i = 0; i <= s.size();) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        std::string item = s.substr(i, j - i);
        while (!item.empty() && item.front() == ' ') item.erase(item.begin());
        while (!item.empty() && item.back() == ' ') item.pop_back();
        errno = 0;
        const bool digits =
            !item.empty() && item.size() <= 18 && item.find_first_not_of("0123456789") == std::string::npos;
        const long long v = digits ? std::strtoll(item.c_str(), nullptr, 10) : -1;
        if (!digits || v < lo || v > hi) {
            *bad = item;
            return false;
        }
        out.push_back(int32_t(v));
        i = j + 1;
    }
    return true;
}

// Token ids: parse_int_list over [0, 2^31 - 1].
inline bool parse_id_list(const std::string& s, std::vector<int32_t>& out, std::string* bad) {
    return parse_int_list(s, 0, 2147483647LL, out, bad);
}

// The option of `opts` that the word a names as written ("-x" for a short name x, "--name" for a long one), or
// nullptr.
inline const cxxopts::HelpOptionDetails* find_option(const cxxopts::Options& opts, const std::string& a) {
    for (const std::string& g : opts.groups())
        for (const cxxopts::HelpOptionDetails& d : opts.group_help(g).options)
            if ((a.size() == 2 && a[0] == '-' && a[1] != '-' && d.s == a.substr(1)) ||
                (a.rfind("--", 0) == 0 && std::find(d.l.begin(), d.l.end(), a.substr(2)) != d.l.end()))
                return &d;
    return nullptr;
}

// Whether the option word a ("-n", "--model") names an option of `opts` that takes a value.
inline bool option_takes_value(const cxxopts::Options& opts, const std::string& a) {
    const cxxopts::HelpOptionDetails* d = find_option(opts, a);
    return d && !d->is_boolean;
}

// Whether the word a names an option of `opts` as written.
inline bool option_word(const cxxopts::Options& opts, const std::string& a) { return find_option(opts, a) != nullptr; }

// For a single-dash word such as -temp or -ngl (a letter, then letters or '-', then nothing, digits or
// "=VALUE": -ngl99, -temp=0.5), which cxxopts would read as the short option -t with the value "emp": the error
// to report, "unknown option -temp=0.5 (did you mean --temp? long options take two dashes)" when `opts` has a
// long option of that name, else "unknown option -ngl (-h lists the options)". "" for any other word (-n5, -p=x:
// a short option and its value).
inline std::string single_dash_word_error(const cxxopts::Options& opts, const std::string& a) {
    auto letter = [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) != 0; };
    auto digit = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
    if (a.size() < 3 || a[0] != '-' || !letter(a[1]) || !letter(a[2])) return "";  // (-n-1, -f-: -n "-1", -f "-")
    size_t end = 2;                                                                // the word: a[1 .. end)
    while (end < a.size() && (letter(a[end]) || a[end] == '-')) end++;
    if (end < 3) return "";
    if (end < a.size() && a[end] != '=' && !std::all_of(a.begin() + long(end), a.end(), digit)) return "";
    const std::string word = a.substr(1, end - 1);
    bool known = false;
    for (const std::string& g : opts.groups())
        for (const cxxopts::HelpOptionDetails& d : opts.group_help(g).options)
            known = known || std::find(d.l.begin(), d.l.end(), word) != d.l.end();
    return "unknown option " + a +
           (known ? " (did you mean --" + word + "? long options take two dashes)" : " (-h lists the options)");
}

// Options whose value is free text, which may look like an option (`-p -n` is the prompt "-n").
inline bool text_option(const cxxopts::Options& opts, const std::string& a) {
    const cxxopts::HelpOptionDetails* d = find_option(opts, a);
    if (d)
        for (const char* t : {"prompt", "system", "text"})
            if (std::find(d->l.begin(), d->l.end(), t) != d->l.end()) return true;
    return false;
}

// The error for the option word a of `opts` that takes a value when the next word is an option word of `opts`
// (a forgotten value: `-m -p hi` would make "-p" the model folder): "-m needs a value (the next word, -p, is an
// option)"; "" otherwise, and for text options (text_option).
inline std::string missing_value_error(const cxxopts::Options& opts, const std::string& a, const std::string& next) {
    const size_t eq = next.rfind("--", 0) == 0 ? next.find('=') : std::string::npos;  // (--temp=0 is an option too)
    if (text_option(opts, a) || !option_word(opts, next.substr(0, eq))) return "";
    return a + " needs a value (the next word, " + next + ", is an option)";
}

// For a word -x=VALUE (cxxopts: "unknown option -="): "-x takes its value as the next word: -x VALUE" when -x
// takes a value, "-x takes no value: write -x alone" when it is a switch, else "unknown option -x"; "" for any
// other word.
inline std::string short_assignment_error(const cxxopts::Options& opts, const std::string& a) {
    if (a.size() < 3 || a[0] != '-' || a[1] == '-' || a[2] != '=') return "";
    const std::string opt = a.substr(0, 2);
    if (!option_word(opts, opt)) return "unknown option " + opt + " (-h lists the options)";
    return option_takes_value(opts, opt) ? opt + " takes its value as the next word: " + opt + " " + a.substr(3)
                                         : opt + " takes no value: write " + opt + " alone";
}

// The first argument error among argv[1 .. argc-1] that cxxopts would misreport ("" when none): a single-dash
// word (single_dash_word_error), a -x=VALUE word (short_assignment_error), or an option word where a value
// belongs (missing_value_error). The word after an option that takes a value is that value and is not checked
// otherwise.
inline std::string first_single_dash_word_error(const cxxopts::Options& opts, int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--") break;
        if (option_takes_value(opts, a)) {
            if (i + 1 < argc)
                if (std::string e = missing_value_error(opts, a, argv[i + 1]); !e.empty()) return e;
            i++;
            continue;
        }
        if (std::string e = short_assignment_error(opts, a); !e.empty()) return e;
        if (std::string e = single_dash_word_error(opts, a); !e.empty()) return e;
    }
    return "";
}

// argv[0 .. argc-1] with each --name=VALUE of an option of `opts` that takes a value split into --name and VALUE
// (cxxopts matches --name=VALUE with a pattern that fails on a VALUE of several lines), up to a "--".
inline std::vector<std::string> split_long_assignments(const cxxopts::Options& opts, int argc, char** argv) {
    std::vector<std::string> out;
    bool operands = false;
    for (int i = 0; i < argc; i++) {
        const std::string a = argv[i];
        operands = operands || a == "--";
        const size_t eq = a.find('=');
        if (i > 0 && !operands && a.rfind("--", 0) == 0 && eq != std::string::npos &&
            option_takes_value(opts, a.substr(0, eq))) {
            out.push_back(a.substr(0, eq));
            out.push_back(a.substr(eq + 1));
        } else {
            out.push_back(a);
        }
    }
    return out;
}

// opts.parse over split_long_assignments of argv (throws what cxxopts throws).
inline cxxopts::ParseResult parse_split(cxxopts::Options& opts, int argc, char** argv) {
    std::vector<std::string> words = split_long_assignments(opts, argc, argv);
    std::vector<char*> av;
    for (std::string& w : words) av.push_back(w.data());
    return opts.parse(int(av.size()), av.data());
}

}  // namespace hy
