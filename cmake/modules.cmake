# The modules of ctuner and the layering between them: the one place that says
# which module may use which (docs/architecture.md, "Layering").
#
#   ct_module(NAME DEPS <modules it uses> HEADERS <public headers it owns>)
#
# NAME is a directory src/NAME; every src/NAME/*.c is in it. DEPS are the
# modules whose public headers (include/ctuner/*.h) NAME's files and headers
# may include, transitively; a module's private headers (src/NAME/*.h, e.g.
# NAME_int.h) are for its own files only. Included twice: by CMakeLists.txt,
# where ct_module() makes the static library ct_NAME linked to its DEPS, and by
# cmake/layering.cmake, which checks every #include against this graph and
# fails the build on a wrong-way one. Listed bottom up.

ct_module(core HEADERS status.h log.h alloc.h rng.h parallel.h json.h safetensors.h fs.h hash.h
                       bf16.h parse.h yaml.h jfields.h)
ct_module(kernels DEPS core HEADERS kernels.h backend.h)
ct_module(image DEPS core HEADERS image.h)
ct_module(storage DEPS core HEADERS storage.h hub.h)
ct_module(comm DEPS core HEADERS comm.h)
ct_module(tb DEPS core HEADERS tfevents.h)
ct_module(optim DEPS core kernels HEADERS optim.h)
ct_module(model DEPS core kernels HEADERS mmdit.h lora.h lora_tools.h unet.h)
ct_module(text DEPS core kernels HEADERS textenc.h t5.h)
ct_module(vae DEPS core kernels HEADERS vae.h)
ct_module(codec DEPS core vae HEADERS codec.h)
ct_module(synth DEPS core image HEADERS synth.h)
ct_module(config DEPS core optim storage HEADERS config.h family.h)
ct_module(data DEPS core image storage comm codec config HEADERS data.h parquet.h)
ct_module(health DEPS core comm config HEADERS health.h)
ct_module(train DEPS core kernels image storage comm optim model text vae codec config data health
          tb HEADERS train.h diffusion.h)
ct_module(serve DEPS core config data HEADERS serve.h)
ct_module(cli DEPS core kernels image storage comm optim model text vae codec synth config data health
          tb train serve)

# Known wrong-way includes being removed: ct_layering_allow(FILE HEADER WHY).
# An entry that no longer matches an include fails the check (delete it).
